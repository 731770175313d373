"""DARE's own sdar-bgpo update on the rows recipe_scale measures ours on: the peer row of issue 36.

`recipe_scale.py --recipes sdar-bgpo` times our update on `--update-rows` rows of the recipe's batch
and scales it to the full batch against the FLOP floor. This script runs what DARE (yjyddq/DARE at
83ae8a3, `recipe/sdar/run_bgpo_sdar_8b_chat.sh`) runs for the same update, on the same rows
(`recipe_scale.recipe_setup`), the same release-layout folder of random bf16 weights, and the same
floor (`recipe_scale.update_flops`), with DARE's code imported at run time from `--dare-root`
(`dare_remote.load_dare`; this repository holds none of it). Its steps, as DARE's actor runs them:

- rows: DARE's rollout tensors: prompts left-padded to `data.max_prompt_length`, responses of
  `rollout.max_new_tokens` (random tokens: random weights fill the budget), per row `mc_num` noised
  copies (`perturbed_seq`, `mask_indices`, `p_mask`; a masking ratio t ~ U(0, 1] per copy);
- micro-batches: `use_dynamic_bsz` with `ppo_max_token_len_per_gpu=5120`, cost multiplier 2 on the
  padded batch (sdar_dp_actor_bgpo.py:77-78,328-335 through `rearrange_micro_batches`): one row
  per micro-batch at 2048 new tokens;
- old pass (`compute_log_prob`, sdar_dp_actor_bgpo.py:219-292): every copy of every row, no grad,
  eval mode; its row is `old (DARE)`;
- update (`update_policy`, sdar_dp_actor_bgpo.py:295-459): per micro-batch and Monte-Carlo copy one
  forward of the `[x_t ; x_0]` row without padding and its BD3LM `BlockMask`
  (block_diffusion_utils.py:537-634,679-848; block_origin "global", dllm_fsdp_workers.py:247-275)
  through the patched `SDARForCausalLM` (compiled flex attention; head and cross entropy / p_mask on
  the noisy targets), under bf16 autocast (sdar_dp_actor_bgpo.py:187), the BGPO loss scaled by
  rows / mini-batch rows / mc_num (:434-439), one backward per copy (:440); gradient checkpointing
  with use_reentrant=False (dllm_fsdp_workers.py:458); bf16 parameters (model_dtype=bfloat16); then
  one clipped AdamW step for the mini-batch (the step's whole batch, `ppo_mini_batch_size`).
  The BGPO loss is `dllm_objectives.bgpo_policy_loss` (equal to DARE's `compute_policy_loss_bgpo`:
  tests/dllm_algorithms/test_parity_block.py); DARE's own imports verl's package (DataProto,
  accelerate), and the loss is arithmetic on [rows] tensors beside the forward and backward.

Seconds are scaled to the full batch like ours (`recipe_scale.run_recipe`: measured x full rows /
update rows, the optimizer step included). Not modelled (stated in the output): FSDP2 parameter and
optimizer offload (the recipe sets both, on 7 GPUs: parameters here stay on the GPU, so the figure
is a lower bound of DARE's), the recipe's `TORCHDYNAMO_DISABLE=1` export (if it reaches the Ray
workers it turns DARE's compiled flex into the unfused eager flex; `--eager-flex` measures that), and
flash-attn's RMSNorm where flash-attn is absent (`dare_remote.install_standins`).

    python3 benchmarks/dare_peer_update.py --dare-root .dare_ref --json $OUT/dare_peer.json   # H200
    python3 benchmarks/recipe_scale.py --recipes sdar-bgpo --peer-dare-root .dare_ref         # both, one table
    uv run python benchmarks/dare_peer_update.py --dare-root PATH --tiny                      # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from dare_remote import Dare, config_defaults, load_dare, restore_rope_buffers  # noqa: E402
from e2e_gpu import _default_dir  # noqa: E402
from recipe_scale import (RECIPE_MODELS, Hardware, RecipeSetup, model_shape, recipe_setup, table,  # noqa: E402
                          update_flops)

MAX_TOKEN_LEN = 5120  # the recipe's actor.ppo_max_token_len_per_gpu
TOKEN_COST = 2  # sdar_dp_actor_bgpo.py:77: [x_t ; x_0] doubles each row
LR, WEIGHT_DECAY = 5e-7, 0.01  # the recipe's actor.optim
GRAD_CLIP = 1.0  # verl's actor.grad_clip default


class Rows:
    """A batch as `rearrange_micro_batches` reads one: `batch["attention_mask"]`, `batch[i:i + 1]`
    and `torch.cat` of such slices (verl passes a TensorDict)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.tensors[key]
        return Rows({k: v[key] for k, v in self.tensors.items()})

    def __len__(self) -> int:
        return len(self.tensors["input_ids"])

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.cat:
            parts = args[0]
            return Rows({k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors})
        return NotImplemented


def dare_rows(prompts: Sequence[Sequence[int]], *, max_prompt: int, new_tokens: int, mc_num: int, vocab: int,
              mask_id: int, pad_id: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """DARE's rollout tensors for `prompts` (one full-length response each) and `mc_num` noised copies.

    Returns:
        input_ids, attention_mask, position_ids [B, P + R] (prompts left-padded to P = max_prompt),
        responses [B, R], perturbed_seq / mask_indices / p_mask [B, mc_num, P + R] (masks only on
        responses, at least one per copy), advantages [B, R] (one value per row, zero-mean).
    """
    if mc_num < 1 or new_tokens < 1 or max_prompt < 1:
        raise ValueError(f"mc_num, new_tokens and max_prompt must be >= 1, got {mc_num}, {new_tokens}, {max_prompt}")
    g = torch.Generator().manual_seed(seed)
    b, p, r = len(prompts), max_prompt, new_tokens
    ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    valid = torch.zeros((b, p + r), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        kept = list(prompt)[-p:]
        ids[i, p - len(kept):p] = torch.tensor(kept, dtype=torch.long)
        valid[i, p - len(kept):] = 1
    responses = torch.randint(0, min(vocab, pad_id, mask_id), (b, r), generator=g)  # below the special ids
    ids[:, p:] = responses
    t = torch.rand(b, mc_num, 1, generator=g).clamp_min(1e-3)
    noised = torch.rand(b, mc_num, r, generator=g) < t
    noised[..., 0] |= ~noised.any(-1)
    mask_indices = torch.zeros((b, mc_num, p + r), dtype=torch.bool)
    mask_indices[..., p:] = noised
    adv = torch.randn(b, generator=g)
    return {"input_ids": ids, "attention_mask": valid, "position_ids": (valid.cumsum(-1) - 1).clamp_min(0),
            "responses": responses, "perturbed_seq": torch.where(mask_indices, mask_id, ids[:, None, :]),
            "mask_indices": mask_indices, "p_mask": t.expand(b, mc_num, p + r).contiguous(),
            "advantages": (adv - adv.mean())[:, None].expand(b, r).contiguous()}


def copy_values(model: Any, dare: Dare, micro: dict[str, torch.Tensor], i: int, *, block_size: int,
                pad_id: int) -> tuple[torch.Tensor, int]:
    """(normalised ELBO [b] of Monte-Carlo copy `i` of the micro-batch's rows, model positions of the
    forward), as DARE's actor computes it (sdar_dp_actor_bgpo.py:100-173,194-207)."""
    r = micro["responses"].shape[-1]
    art = dare.artifacts(noisy_input_ids=micro["perturbed_seq"][:, i], clean_input_ids=micro["input_ids"],
                         attention_mask=micro["attention_mask"], position_ids=micro["position_ids"],
                         target_mask=micro["mask_indices"][:, i], p_mask=micro["p_mask"][:, i],
                         prompt_section_length=micro["input_ids"].shape[-1] - r, pad_token_id=pad_id)
    mask = dare.block_mask(art, block_size=block_size, block_origin="global")
    ids, positions, target, targets, p_mask = dare.full_tensors(art)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, return_dict=True,
                logits_to_keep=target, ulysses_sp_training=True, ulysses_sp_targets=targets[target].contiguous(),
                ulysses_sp_p_mask=p_mask[target].contiguous(), ulysses_sp_answer_len=art.response_lengths.sum(),
                ulysses_sp_return_token_loss=True)
    nll = out.block_diffusion_token_loss.float()[:, :art.sequence_length] * art.target_mask.float()
    count = micro["attention_mask"][:, -r:].sum(-1).clamp_min(1).float()
    return -nll.sum(-1) / count, int(ids.numel())


def micro_batches(dare: Dare, rows: dict[str, torch.Tensor], max_token_len: int) -> list[dict[str, torch.Tensor]]:
    """DARE's dynamic micro-batches of `rows` (`rearrange_micro_batches`, padded, cost x2)."""
    parts, _ = dare.micro_batches(Rows(rows), max_token_len, token_cost_multiplier=TOKEN_COST, padded_batch=True)
    return [part.tensors for part in parts]


def autocast(device: torch.device) -> Any:
    """DARE's bf16 autocast on CUDA (sdar_dp_actor_bgpo.py:187); none on the CPU (tests run float32)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def old_pass(model: Any, dare: Dare, micros: Sequence[dict[str, torch.Tensor]], *, block_size: int,
             pad_id: int) -> list[torch.Tensor]:
    """`compute_log_prob`: per micro-batch the values [b, mc_num] of every copy, no grad, eval mode."""
    model.eval()
    out = []
    with torch.no_grad():
        for micro in micros:
            dev = {k: v.to(model.device) for k, v in micro.items()}
            with autocast(model.device):
                vals = [copy_values(model, dare, dev, i, block_size=block_size, pad_id=pad_id)[0]
                        for i in range(dev["perturbed_seq"].shape[1])]
            out.append(torch.stack(vals, 1).float())
    return out


def update(model: Any, dare: Dare, micros: Sequence[dict[str, torch.Tensor]], old: Sequence[torch.Tensor],
           optimizer: torch.optim.Optimizer, *, block_size: int, pad_id: int,
           grad_clip: float = GRAD_CLIP) -> dict[str, float]:
    """`update_policy` on one mini-batch (all `micros`): per micro-batch and copy a forward, the BGPO
    loss x rows / mini-batch rows / mc_num, a backward; then one clipped optimizer step.

    Returns:
        forwards, model_tokens (positions through the model), loss (summed as backpropagated),
        optimizer_s (the clip and step alone).
    """
    from dllm_objectives import bgpo_policy_loss

    model.train()
    optimizer.zero_grad()
    total_rows = sum(len(m["input_ids"]) for m in micros)
    forwards = tokens = 0
    loss_sum = 0.0
    for micro, old_vals in zip(micros, old, strict=True):
        dev = {k: v.to(model.device) for k, v in micro.items()}
        mc = dev["perturbed_seq"].shape[1]
        resp_mask = dev["attention_mask"][:, -dev["responses"].shape[-1]:].bool()
        adv = dev["advantages"][:, 0].float()
        for i in range(mc):
            with autocast(model.device):
                value, n = copy_values(model, dare, dev, i, block_size=block_size, pad_id=pad_id)
                loss, _ = bgpo_policy_loss(value, old_vals[:, i].to(value.device), adv, resp_mask)
            loss = loss * (len(dev["input_ids"]) / total_rows) / mc
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += float(loss.detach())
            forwards += 1
            tokens += n
    t0 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad()
    _sync(model.device)
    return {"forwards": float(forwards), "model_tokens": float(tokens), "loss": loss_sum,
            "optimizer_s": time.perf_counter() - t0}


def reference_values(model: Any, rows: dict[str, torch.Tensor], block_size: int) -> torch.Tensor:
    """The values [B, mc_num] of `rows` from their definition, on our `dllm_models` model (`--compare`):
    per row and copy the unpadded `[x_t ; x_0]` through the BD3LM mask (blocks from position 0), then
    -sum over the copy's targets of NLL / p_mask, over the response length."""
    from dllm_models.mask import AttentionMask

    out = torch.zeros(rows["perturbed_seq"].shape[:2])
    device = next(model.parameters()).device
    r_len = rows["responses"].shape[1]
    for r in range(out.shape[0]):
        keep = rows["attention_mask"][r].bool()
        clean = rows["input_ids"][r][keep]
        n = len(clean)
        blocks = torch.arange(n) // block_size
        is_clean = torch.cat([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)])
        mask = AttentionMask(block_ids=torch.cat([blocks, blocks])[None].to(device), is_clean=is_clean[None].to(device))
        for i in range(out.shape[1]):
            noisy, target = rows["perturbed_seq"][r, i][keep], rows["mask_indices"][r, i][keep]
            ids = torch.cat([noisy, clean])[None].to(device)
            pos = torch.cat([torch.arange(n), torch.arange(n)])[None].to(device)
            with torch.no_grad():
                hidden, _ = model.hidden_states(ids, position_ids=pos, attention=mask, attention_backend="sdpa")
                logp = model.lm_head(hidden[0, :n]).float().log_softmax(-1).cpu()
            nll = -logp.gather(-1, clean[:, None])[:, 0] / rows["p_mask"][r, i][keep]
            out[r, i] = -nll[target].sum() / r_len
    return out


def compare_with_ours(setup: RecipeSetup, dare: Dare, device: str, *, rows_n: int = 2, mc_num: int = 2) -> float:
    """Max |DARE's value - ours| over `rows_n` rows x `mc_num` copies of `setup`'s update rows, both
    models float32 on `setup`'s folder: that the peer runs the same function as our model."""
    from dllm_models import load_model

    dare_model, _ = load_peer_model(dare, setup.folder, device, dtype=torch.float32)
    conf = dare_model.config
    pad_id = int(getattr(conf, "pad_token_id", None) or conf.eos_token_id)
    rows = dare_rows(setup.prompts_update[:rows_n], max_prompt=setup.cfg.data.max_prompt_length,
                     new_tokens=setup.cfg.rollout.max_new_tokens, mc_num=mc_num, vocab=int(conf.vocab_size),
                     mask_id=int(conf.mask_token_id), pad_id=pad_id, seed=1)
    theirs = torch.cat(old_pass(dare_model, dare, micro_batches(dare, rows, MAX_TOKEN_LEN), block_size=int(
        conf.block_size), pad_id=pad_id)).cpu()
    del dare_model
    ours = load_model(setup.folder, dtype=torch.float32).to(device)
    mine = reference_values(ours, rows, int(conf.block_size))
    print(f"values, DARE's path: {theirs.tolist()}\nvalues, our model:   {mine.tolist()}", flush=True)
    return float((theirs - mine).abs().max())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_peer_model(dare: Dare, folder: Path, device: str, *, dtype: torch.dtype) -> tuple[Any, list[str]]:
    """DARE's `SDARForCausalLM` on `folder`, patched as verl patches it, with gradient checkpointing.

    The recipe's `attn_implementation=flash_attention_2` reaches only the model's eval path (training
    attention is the patched flex); the folder loads with sdpa, which needs no flash-attn.

    Returns:
        (model, notes on config attributes a newer transformers lacked).
    """
    config = dare.config_cls.from_pretrained(str(folder))
    notes = config_defaults(config)
    model = dare.model_cls.from_pretrained(str(folder), config=config, dtype=dtype, attn_implementation="sdpa")
    notes += restore_rope_buffers(model)
    if dare.patch is not None:
        dare.patch(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device), notes


def peer_rows(setup: RecipeSetup, dare: Dare, hw: Hardware, device: str, *,
              max_token_len: int = MAX_TOKEN_LEN, warmup: bool = True) -> list[dict[str, Any]]:
    """DARE's old pass and update on `setup`'s update rows, timed and scaled as recipe_scale scales
    ours, against the same floors (`update_flops` over the full batch)."""
    import transformers

    cfg = setup.cfg
    alg, sampling = cfg.algorithm, cfg.rollout
    # DARE's process starts with no compiled graphs: ours (recipe_scale, same process) compiled the same
    # `flex_attention` code object and would count toward its recompile limit (eager flex past it)
    torch._dynamo.reset()
    dtype = getattr(torch, cfg.checkpoint.dtype)  # the recipe's parameter dtype (DARE: model_dtype=bfloat16)
    model, config_notes = load_peer_model(dare, setup.folder, device, dtype=dtype)
    conf = model.config
    block_size = int(conf.block_size)
    pad_id = int(getattr(conf, "pad_token_id", None) or conf.eos_token_id)
    rows = dare_rows(setup.prompts_update, max_prompt=cfg.data.max_prompt_length, new_tokens=sampling.max_new_tokens,
                     mc_num=int(alg.mc_num), vocab=int(conf.vocab_size), mask_id=int(conf.mask_token_id), pad_id=pad_id)
    micros = micro_batches(dare, rows, max_token_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    dev = torch.device(device)
    if warmup:  # compilation (flex), allocator and the optimizer state, on one copy of one row
        first = {k: v[:1, :1] if k in ("perturbed_seq", "mask_indices", "p_mask") else v[:1]
                 for k, v in micros[0].items()}
        update(model, dare, [first], old_pass(model, dare, [first], block_size=block_size, pad_id=pad_id), optimizer,
               block_size=block_size, pad_id=pad_id)
    _sync(dev)
    t0 = time.perf_counter()
    old = old_pass(model, dare, micros, block_size=block_size, pad_id=pad_id)
    _sync(dev)
    old_s = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    stats = update(model, dare, micros, old, optimizer, block_size=block_size, pad_id=pad_id)
    _sync(dev)
    update_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None
    raw = json.loads((setup.folder / "config.json").read_text())
    fwd, fwd_bwd = update_flops(alg, sampling, [len(p) for p in setup.prompts_full], model_shape(model, raw))
    scale = setup.full_rows / len(setup.prompts_update)
    head = {"recipe": setup.recipe, "model": RECIPE_MODELS[setup.recipe], "rows": setup.full_rows,
            "update_rows": len(setup.prompts_update), "max_new_tokens": sampling.max_new_tokens,
            "prompt_len_mean": sum(map(len, setup.prompts_full)) / setup.full_rows, "peer": "DARE 83ae8a3",
            "env": f"torch {torch.__version__}, transformers {transformers.__version__} (DARE pins 2.9.1 / 4.57.1)",
            "micro_batches": len(micros), "notes": list(dare.notes) + config_notes + [
                "parameters and optimizer state stay on the device (the recipe offloads both under FSDP2: not modelled)"]}
    iters = int(getattr(alg, "num_iterations", 1))
    out = [{**head, "phase": "old (DARE)", "seconds": old_s * scale, "measured_s": old_s, "floor_s": fwd / hw.flops,
            "required_tflop": fwd / 1e12},
           {**head, "phase": "update (DARE)", "seconds": update_s * scale, "measured_s": update_s,
            "floor_s": fwd_bwd * iters / hw.flops, "required_tflop": fwd_bwd * iters / 1e12, "peak_gib": peak,
            "peak_scope": "the update alone (old pass and warm-up before the reset)",
            "update_passes": stats["forwards"] * scale, "measured_passes": stats["forwards"],
            "model_tokens": stats["model_tokens"], "optimizer_s": stats["optimizer_s"], "loss": stats["loss"]}]
    del model, optimizer
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dare-root", type=Path, required=True, help="a checkout of yjyddq/DARE (or a copy of "
                    "dare_remote.FILES under the same paths)")
    ap.add_argument("--recipe", default="sdar-bgpo", choices=["sdar-bgpo"])
    ap.add_argument("--update-rows", type=int, default=8, help="rows of the measured update (as recipe_scale's)")
    ap.add_argument("--max-token-len", type=int, default=MAX_TOKEN_LEN, help="DARE's ppo_max_token_len_per_gpu")
    ap.add_argument("--eager-flex", action="store_true", help="TorchDynamo off (the recipe's TORCHDYNAMO_DISABLE=1): "
                    "DARE's flex attention runs unfused")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a dotted recipe override")
    ap.add_argument("--tflops", type=float, default=790.0)
    ap.add_argument("--hbm-tbs", type=float, default=4.8)
    ap.add_argument("--checkpoints", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=None, help="model folders (default /dev/shm/recipe_scale, "
                    "the folder recipe_scale writes; tiny: a temp dir)")
    ap.add_argument("--tiny", action="store_true", help="2-layer model, short responses, CPU")
    ap.add_argument("--compare", action="store_true", help="first check, in float32 on 2 rows x 2 copies, that DARE's "
                    "path computes the values our dllm_models model computes on the same folder (prints the gap)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """`main` after parsing (the tiny workdir is a temporary folder)."""
    import tempfile

    if args.eager_flex:
        torch._dynamo.config.disable = True
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    args.checkpoints = args.checkpoints or _default_dir("checkpoints")
    hw = Hardware(flops=args.tflops * 1e12, bandwidth=args.hbm_tbs * 1e12)
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or (Path(tmp) if args.tiny else Path("/dev/shm/recipe_scale"))
        dare = load_dare(args.dare_root, cpu_attention=device == "cpu")
        setup = recipe_setup(args.recipe, args, device)
        if args.compare:
            print(f"max |DARE - ours| = {compare_with_ours(setup, dare, device):.3g}", flush=True)
        rows = peer_rows(setup, dare, hw, device, max_token_len=args.max_token_len)
    for r in rows:
        r["floor_over_measured"] = r["floor_s"] / r["seconds"] if r["seconds"] > 0 else float("nan")
        if args.eager_flex:
            r["phase"] += " [eager flex]"
        print(json.dumps(r), flush=True)
    print(f"\ndevice={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} torch={torch.__version__} "
          f"matmul={args.tflops:g} TFLOP/s; DARE: {'; '.join(rows[-1]['notes'])}")
    print(table(rows))
    for r in rows:
        peak = f", peak {r['peak_gib']:.1f} GiB" if r.get("peak_gib") is not None else ""
        print(f"{r['phase']}: {r['measured_s']:.2f} s on {r['update_rows']} rows, {r['seconds']:.1f} s scaled "
              f"x{r['rows'] / r['update_rows']:g}, floor {r['floor_s']:.3g} s, floor / measured "
              f"{r['floor_over_measured']:.3g}{peak}")
    target = args.json or (Path(os.environ["OUT"]) / "dare_peer.json" if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One RL iteration at real shapes: rollout + old log-probs + policy update, fast path vs baseline.

Random bf16 weights at the released shapes (benchmarks/configs/<name>/config.json), one GPU,
8 prompts x 8 samples = 64 sequences, prompts of 128..256 tokens (left-padded to 256), 256 new
tokens. The loss is the clipped policy loss on one masked copy per sample (every response
token masked, prompt tokens with p = 0.15: `dllm_objectives.one_step_masks`), so the iteration is
one no-grad pass for the old log-probs and one forward + backward for the update, then AdamW.
The passes run in micro-batches of `--micro` sequences (gradients accumulated). Gradient
checkpointing is on in the baseline (it does not fit without) and off in the fast path, whose
packed rows and fused head leave room for the activations (`--fast-checkpointing` keeps it on).

| path | rollout | old log-probs and update |
| --- | --- | --- |
| baseline (padded eager) | no cache: LLaDA recomputes the whole canvas every step, SDAR recomputes every finished block (`cache=None`) | padded batch, SDPA with a dense mask, float32 [tokens, vocab] logits; SDAR: the padded BD3LM [x_t ; x_0] rows |
| fast | LLaDA: Fast-dLLM dual cache; SDAR: the static KV cache of finished blocks in one CUDA graph | packed rows (`use_training_attention`: `varlen` for LLaDA, `flex` BD3LM for SDAR), fused Triton log-prob head, no separate old pass (one update per batch: the training forward's detached values are the old values, `ActorWorker(reuse_old=True)`) |

The baseline rollout is timed on `--baseline-blocks` blocks and extrapolated: LLaDA's no-cache
step costs the same at every block (linear extrapolation is exact); SDAR's recompute step grows
with the decoded length, so its first blocks and its last blocks are timed (the last ones by a
prompt that ends where the response would) and the trapezoid of the two gives the full decode.

    python benchmarks/rl_iteration_bench.py                     # H200, both models, ~6 min
    python benchmarks/rl_iteration_bench.py --models SDAR-8B-Chat
    uv run python benchmarks/rl_iteration_bench.py --tiny       # CPU smoke run (2 layers)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dllm_models.attention import AttentionMask
from dllm_objectives import apply_mask, clipped_policy_loss, one_step_masks
from dllm_rollout import SamplingConfig, decode
from dllm_train.likelihood import Scorer, positions
from dllm_train.packed_scoring import use_training_attention

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rollout_bench import _model  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build(name: str, tiny: bool, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """The rollout benchmark's random-weight model, gradient checkpointing switched on."""
    model = _model(name, tiny, device, dtype)
    model.gradient_checkpointing = True
    return model


def prompts(batch: int, group: int, max_len: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts [B * G, max_len]: B distinct prompts of max_len/2..max_len tokens, G copies."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=g)
    ids = torch.randint(0, vocab, (batch, max_len), generator=g)
    mask = torch.arange(max_len)[None] >= (max_len - lengths)[:, None]
    ids = torch.where(mask, ids, 0)
    return ids.repeat_interleave(group, 0).to(device), mask.repeat_interleave(group, 0).to(device)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def rollout_seconds(model: Any, cfg: SamplingConfig, ids: torch.Tensor, mask: torch.Tensor, *, measure: int | None,
                    growing: bool) -> tuple[Any, float, str]:
    """(batch of the measured decode, estimated seconds of the full decode, how it was estimated)."""
    seeds = torch.arange(ids.shape[0])
    blocks = cfg.max_new_tokens // cfg.block_length
    # warm-up (cuBLAS handles, kernel selection): one block, not timed
    one = dataclasses.replace(cfg, max_new_tokens=cfg.block_length,
                              steps=cfg.steps if cfg.block_diffusion else cfg.steps_per_block)
    decode(model, ids, mask, seeds, one)
    if measure is None or measure >= blocks:
        out, secs = timed(lambda: decode(model, ids, mask, seeds, cfg))
        return out, secs, "measured"
    short = dataclasses.replace(cfg, max_new_tokens=measure * cfg.block_length,
                                steps=cfg.steps if cfg.block_diffusion else cfg.steps_per_block * measure)
    out, first = timed(lambda: decode(model, ids, mask, seeds, short))
    if not growing:
        return out, first * blocks / measure, f"{measure}/{blocks} blocks, linear"
    # the last `measure` blocks: a prompt that ends where the response's last blocks begin
    extra = (blocks - measure) * cfg.block_length
    filler = torch.randint(0, 1000, (ids.shape[0], extra), generator=torch.Generator().manual_seed(1)).to(ids.device)
    late_ids = torch.cat([ids, filler], dim=1)
    late_mask = torch.cat([mask, torch.ones_like(filler, dtype=torch.bool)], dim=1)
    _, last = timed(lambda: decode(model, late_ids, late_mask, seeds, short))
    return out, (first + last) / 2 * blocks / measure, f"{measure}+{measure}/{blocks} blocks, trapezoid"


def bd3lm_padded_logp(model: Any, noisy: torch.Tensor, attn: torch.Tensor, clean: torch.Tensor,
                      block: int) -> torch.Tensor:
    """Baseline BDLM likelihood: padded rows [x_t ; x_0] with a dense SDPA mask and full logits."""
    pos = positions(attn)
    bid = torch.div(pos, block, rounding_mode="floor")
    m, s = noisy.shape
    mask = AttentionMask(
        key_padding=torch.cat([attn, attn], 1), block_ids=torch.cat([bid, bid], 1),
        is_clean=torch.cat([torch.zeros_like(attn), torch.ones_like(attn)], 1),
    )
    logits = model(torch.cat([noisy, clean], 1), position_ids=torch.cat([pos, pos], 1), attention=mask).logits
    logp = torch.log_softmax(logits[:, :s].float(), dim=-1)
    return logp.gather(-1, clean[..., None]).squeeze(-1)


def train_passes(model: Any, rollout: Any, *, fast: bool, micro: int, temperature: float,
                 optimizer: torch.optim.Optimizer, checkpointing: bool) -> dict[str, float]:
    """Old log-probs (no grad) and one update (fwd + bwd, micro-batched) + optimizer step; seconds."""
    block = model.traits.block_length
    model.gradient_checkpointing = checkpointing
    on_gpu = rollout.response_ids.is_cuda
    backend = (("flex" if block else "varlen") if on_gpu else "sdpa") if fast else None
    use_training_attention(model, backend)
    scorer = Scorer(model)
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    p = rollout.prompt_ids.shape[1]
    attn = torch.cat([rollout.prompt_mask.bool(), rollout.response_mask.bool()], 1)
    prompt_valid = attn.clone()
    prompt_valid[:, p:] = False
    response_valid = attn & ~prompt_valid
    plan = one_step_masks(prompt_valid, response_valid, generator=torch.Generator(device=ids.device).manual_seed(0))
    noisy = apply_mask(ids, plan, scorer.mask_id)[:, 0]
    adv = torch.randn(ids.shape[0], device=ids.device)
    chunks = [slice(i, i + micro) for i in range(0, ids.shape[0], micro)]

    def logp(sl: slice) -> torch.Tensor:
        if fast or block is None:
            return scorer(noisy[sl], attn[sl], ids[sl], temperature=temperature)
        return bd3lm_padded_logp(model, noisy[sl], attn[sl], ids[sl], block)

    def old_pass() -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return torch.cat([logp(sl) for sl in chunks])

    # fast path: one update per batch with the default update, so the old values are the training
    # forward's own values (dllm_train.ActorWorker(reuse_old=True)); the baseline runs the pass
    old, t_old = timed(old_pass) if not fast else (None, 0.0)

    def update() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        total = response_valid.sum()
        for sl in chunks:
            lp = logp(sl)[:, p:]
            behaviour = lp.detach() if old is None else old[sl, p:]
            loss, _ = clipped_policy_loss(lp, behaviour, adv[sl], response_valid[sl, p:],
                                          agg="seq-mean-token-sum-norm", norm_const=1.0)
            (loss / total).backward()
        torch.nn.utils.clip_grad_norm_([q for q in model.parameters() if q.grad is not None], 1.0)
        optimizer.step()

    _, t_update = timed(update)
    use_training_attention(model, None)
    return {"old_logp_s": t_old, "update_s": t_update}


def bench(name: str, args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    model = build(name, args.tiny, device, dtype)
    block_model = model.traits.block_length is not None
    vocab = min(int(model.get_output_embeddings().weight.shape[0]), 100_000)
    ids, mask = prompts(args.prompts, args.group, args.prompt_len, vocab, device)
    new = args.new_tokens
    if block_model:
        bl = model.traits.block_length
        base = SamplingConfig(max_new_tokens=new, block_length=bl, steps=bl, block_diffusion=True,
                              temperature=1.0, top_k=50, stop_at_eos=False)
        variants = [("baseline", dataclasses.replace(base, cache=None), args.baseline_blocks or 8, True),
                    ("fast", dataclasses.replace(base, cache="prefix"), None, False)]
    else:
        base = SamplingConfig(max_new_tokens=new, block_length=32 if not args.tiny else 8, steps=new // 2,
                              temperature=0.6)
        variants = [("baseline", base, args.baseline_blocks or 2, False),
                    ("fast", dataclasses.replace(base, cache="dual"), None, False),
                    ("fast+threshold0.9", dataclasses.replace(base, cache="dual", threshold=0.9), None, False)]
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-6, foreach=True)
    rows = []
    wanted = [x for x in args.paths.split(",") if x]
    variants = [v for v in variants if not wanted or v[0] in wanted]
    for label, cfg, measure, growing in variants:
        model.eval()
        rollout, r_secs, how = rollout_seconds(model, cfg, ids, mask, measure=measure, growing=growing)
        if rollout.response_ids.shape[1] != new:  # baseline measured on a prefix: train on a full-length batch
            rollout = _full_length(rollout, new, model)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        fast = label != "baseline"
        ckpt = not fast or args.fast_checkpointing
        micro = args.fast_micro if fast and args.fast_micro else args.micro
        for _ in range(2):  # the first is a warm-up: compiles flex / Triton, allocates the optimizer state
            times = train_passes(model, rollout, fast=fast, micro=micro, temperature=cfg.temperature or 1.0,
                                 optimizer=optimizer, checkpointing=ckpt)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        total = r_secs + times["old_logp_s"] + times["update_s"]
        rows.append({"model": name, "path": label, "checkpointing": ckpt, "micro": micro, "rollout_s": r_secs, "rollout_how": how,
                     **times,
                     "iteration_s": total, "train_peak_gib": peak,
                     "real_tokens": int(torch.cat([rollout.prompt_mask, rollout.response_mask], 1).sum())})
        print(json.dumps(rows[-1]), flush=True)
    base_total = rows[0]["iteration_s"] if rows and rows[0]["path"] == "baseline" else float("nan")
    for row in rows:
        row["speedup"] = base_total / row["iteration_s"]
    del model, optimizer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _full_length(rollout: Any, new: int, model: Any) -> Any:
    """The measured prefix decode padded out with random response tokens to `new` columns."""
    b, have = rollout.response_ids.shape
    vocab = min(int(model.get_output_embeddings().weight.shape[0]), 100_000)
    extra = torch.randint(0, vocab, (b, new - have), generator=torch.Generator().manual_seed(2)).to(
        rollout.response_ids.device)
    ids = torch.cat([rollout.response_ids, extra], 1)
    return dataclasses.replace(rollout, response_ids=ids, response_mask=torch.ones_like(ids, dtype=torch.bool))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="LLaDA-8B-Instruct,SDAR-8B-Chat")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=8, help="sequences per micro-batch of the training passes")
    ap.add_argument("--fast-micro", type=int, default=None,
                    help="micro-batch of the fast path (default --micro); smaller fits without checkpointing")
    ap.add_argument("--baseline-blocks", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--paths", default="", help="comma-separated subset of: baseline,fast,fast+threshold0.9")
    ap.add_argument("--fast-checkpointing", action="store_true",
                    help="keep gradient checkpointing on in the fast path too (default: off there, since "
                         "packing and the fused head leave room for the activations; the baseline needs it)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.tiny:
        args.prompts, args.group, args.prompt_len, args.new_tokens = 2, 2, 16, 16
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += bench(name.strip(), args, device, dtype)
    print(f"\ndevice={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} torch={torch.__version__}")
    print(f"{'model':22s} {'path':18s} {'rollout s':>10s} {'old s':>7s} {'update s':>9s} {'iter s':>8s} "
          f"{'speed-up':>8s} {'peak GiB':>8s}  rollout timing")
    for r in rows:
        peak = f"{r['train_peak_gib']:8.1f}" if r["train_peak_gib"] is not None else f"{'-':>8s}"
        print(f"{r['model']:22s} {r['path']:18s} {r['rollout_s']:10.2f} {r['old_logp_s']:7.2f} {r['update_s']:9.2f} "
              f"{r['iteration_s']:8.2f} {r['speedup']:7.2f}x {peak}  {r['rollout_how']}")
    target = args.json or (os.path.join(os.environ["OUT"], "rl_iteration_bench.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

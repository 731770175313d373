"""The RL step at the recipes' own scale, through the product, against its physical floor (issue 23).

For each recipe (`sdar-bgpo` on SDAR-8B-Chat, `llada-d1` and `llada-cj-grpo` on LLaDA-8B-Instruct,
`dream-d1` on Dream-v0-Instruct-7B) the script

1. builds the run config exactly as `dare train <recipe> [overrides]` does
   (`dare.recipes.get_recipe` + `dare.recipes.resolve`), with `checkpoint.checkpoint` set to a
   release-layout folder of random bf16 weights (`e2e_gpu.prepare_model`: the release's config and
   tokenizer, weights reused when the folder holds them) and `data.train_files=gsm8k`;
2. loads the policy and builds the RL phase the way `dare train` does
   (`dare.pipeline.policy_with_adapters`, `dare.rl_backend.rl_backend`: a `dllm_train.LocalRL` with
   the recipe's algorithm, rollout, optimizer and trainer settings);
3. rollout: the local rank's rollout worker (`dllm_rollout.decode` or the algorithm's own
   `generate`, as in the step) decodes the recipe's full batch, `rl.prompts_per_step x
   rl.group_size` rows (GSM8K chat prompts encoded by `dare.rl_data.rl_prompts`);
4. update: one `LocalRL.step` on `--update-rows` rows (`--update-rows / group_size` prompts); its
   old / reference / update seconds and `update_passes` are scaled by full rows / update rows;
5. `--lmdeploy` (block families): the same full-batch rollout through the product's
   `EngineRolloutWorker` (what `rollout.engine=lmdeploy` runs) on the same folder; its decode
   seconds exclude the weight hand-off;
6. `--peer-dare-root PATH` (sdar-bgpo): DARE's own old pass and update on the same update rows,
   folder and floors, its code imported from the checkout at PATH (`dare_peer_update.py`), rows
   `old (DARE)` and `update (DARE)`.

`--update-set KEY=VALUE` changes the config of the measured step only (its rollout and update), not
the timed full-batch rollout, and only where the update's required FLOPs stay the same (checked):
e.g. `rollout.steps=16` lets `llada-d1`'s update run on the recipe's full 128 rows (its update is
one pass per sequence whatever the steps) without a 480 s no-cache rollout in each step.
`--update-only` skips the timed full-batch rollout. `--profile N` runs one more step with the
actor's update under `torch.profiler` and prints its top N kernels by device time, grouped
(attention forward / backward, GEMMs, the rest), and the layers the last training forward
checkpointed.

`--max-forwards K` time-boxes the native rollout (the LLaDA/Dream recipes decode without a cache:
256 full forwards of 128 rows, minutes): it stops after K forwards and extrapolates the seconds
along the floor, seconds x floor(all forwards) / floor(first K). A recipe that runs out of GPU
memory gets an "out of memory" row (its own batch not fitting is a result) and the next one runs.

Floors (constants are flags; defaults: H200, 790 TFLOP/s bf16 dense matmul as measured in
docs/benchmarks.md, 4.8 TB/s HBM3e datasheet):

- decode, per forward: max(W / BW, F_lin / R) + K / BW, where W = bytes of the non-embedding
  weights, F_lin = 2 x non-embedding params x tokens of the forward + 4 x q_width x layers x
  (query, key) pairs, K = KV-cache bytes read (2 x layers x kv_heads x head_dim x bytes per cached
  position), summed over the forwards the SamplingConfig implies:
  block families (`block_diffusion`), cache prefix: one prefill of the prompts, then per block
  `steps` denoising forwards of B tokens per row + 1 store pass, each reading the cache of the
  prompt and the finished blocks; no cache: `steps` forwards per block over the canvas so far.
  Masked families (LLaDA, Dream), `steps` over N / B blocks: no cache: every step is a full
  forward over prompt + N; prefix: per block one full forward, then steps-1 forwards of [block
  start, end of canvas) reading the prefix cache; dual: per block one full forward, then steps-1
  forwards of the block reading the prefix and suffix caches. Threshold decoding may take fewer
  steps (the floor then is the full-steps bound). The forwards the policy actually ran are
  counted with a forward pre-hook and printed beside the formula's count.
- update: required FLOPs / R. Per scored row: 6 x params x tokens (+ 12 x q_width x layers x
  allowed pairs). Masked families: each scored row is a full bidirectional forward over
  prompt + response (d1: 1 row per sequence; CJ-GRPO: one row per trajectory state = rollout
  steps; GDPO: one row per quadrature node and mask draw; TraceRL: one row per merged unmask step,
  ceil(steps / shrink), the full-steps bound). Block families (BGPO with mc_num masks; TraceRL with
  ceil(steps per block / shrink) rows): the clean half x_0 (prompt + response) ONCE per
  sequence plus mc_num noised responses; the pairs follow the BD3LM mask (a position sees up to the
  end of its block). Recomputation from activation checkpointing is overhead, not required. The old
  and reference passes (when the step ran them) have floors of 2 x params x tokens (+ 4 x ... pairs).

    python3 benchmarks/e2e_gpu.py --prepare-devshare --runs sdar-bgpo,llada-d1,dream-d1
    python3 benchmarks/recipe_scale.py --recipes sdar-bgpo --lmdeploy --json $OUT/recipe_scale_sdar.json  # H200
    python3 benchmarks/recipe_scale.py --recipes sdar-bgpo --peer-dare-root .dare_ref   # + DARE's own update, same rows
    python3 benchmarks/recipe_scale.py --recipes llada-d1 --max-forwards 64 --json $OUT/recipe_scale_llada_d1.json
    python3 benchmarks/recipe_scale.py --recipes llada-cj-grpo --json $OUT/recipe_scale_llada_cj.json
    python3 benchmarks/recipe_scale.py --recipes dream-d1 --max-forwards 64 --json $OUT/recipe_scale_dream.json
    uv run python benchmarks/recipe_scale.py --tiny                                        # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_gpu import _default_dir, prepare_model  # noqa: E402  (puts every member's src on sys.path)
from engine_decode import _sync  # noqa: E402

import torch  # noqa: E402

RECIPE_MODELS = {"sdar-bgpo": "SDAR-8B-Chat", "llada-d1": "LLaDA-8B-Instruct",
                 "llada-cj-grpo": "LLaDA-8B-Instruct",
                 "llada-gdpo": "LLaDA-8B-Instruct", "sdar-tracerl": "SDAR-8B-Chat", "dream-d1": "Dream-v0-Instruct-7B"}
# --tiny: shorter responses and fewer prompts (the recipe's other settings kept)
TINY_OVERRIDES = {"block": ["checkpoint.dtype=float32", "rollout.max_new_tokens=16", "rl.prompts_per_step=2", "data.max_prompt_length=128",
                            "algorithm.mc_num=2"],
                  "masked": ["checkpoint.dtype=float32", "rollout.max_new_tokens=16", "rollout.steps=4", "rollout.block_length=8",
                             "rl.prompts_per_step=2", "data.max_prompt_length=128"]}


# ----------------------------------------------------------------------------- shapes and floors


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the floors read of a model: non-embedding params, their bytes, KV bytes per position."""

    params: int
    weight_bytes: int
    kv_bytes_per_pos: int
    q_width_layers: int  # attention heads x head_dim x layers


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Matmul rate (FLOP/s) and HBM bandwidth (bytes/s) of the floors."""

    flops: float
    bandwidth: float


def model_shape(model: Any, raw: dict[str, Any]) -> Shape:
    """The floors' view of `model` (params read from the module, attention sizes from `raw`)."""
    out = model.get_output_embeddings().weight
    params = sum(p.numel() for p in model.parameters())
    for m in model.modules():  # an input table is a gather, not a matmul read (unless tied to the head)
        if isinstance(m, torch.nn.Embedding) and m.weight is not out:
            params -= m.weight.numel()
    elem = out.element_size()
    layers = int(raw.get("num_hidden_layers", raw.get("n_layers", 0)))
    heads = int(raw.get("num_attention_heads", raw.get("n_heads", 0)))
    kv_heads = int(raw.get("num_key_value_heads", raw.get("n_kv_heads", heads)) or heads)
    width = int(raw.get("hidden_size", raw.get("d_model", 0)))
    head_dim = int(raw.get("head_dim") or width // heads)
    return Shape(params=params, weight_bytes=params * elem, kv_bytes_per_pos=2 * layers * kv_heads * head_dim * elem,
                 q_width_layers=heads * head_dim * layers)


def block_pairs(start: int, end: int, block: int) -> int:
    """Sum over positions t in [start, end) of (t // block + 1) x block: the keys each sees under a
    block-causal mask aligned at 0 (its own block and everything before)."""
    return sum((t // block + 1) * block for t in range(start, end))


def decode_floor(cfg: Any, prompt_lens: Sequence[int], shape: Shape, hw: Hardware,
                 limit: int = 0) -> dict[str, float]:
    """Seconds and forward count of the floor of one decode of `prompt_lens` rows under `cfg`
    (a `dllm_rollout.SamplingConfig`), the formula of the module docstring; `limit` > 0 also gives
    the floor of its first `limit` forwards (`floor_first_s`)."""
    rows = len(prompt_lens)
    psum = sum(prompt_lens)
    n, bl, steps = cfg.max_new_tokens, cfg.block_length, cfg.steps
    total = first = 0.0
    forwards = 0
    tokens = 0

    def forward(q_tokens: int, pairs: int, kv_read: int) -> None:
        nonlocal total, first, forwards, tokens
        compute = (2 * shape.params * q_tokens + 4 * shape.q_width_layers * pairs) / hw.flops
        total += max(shape.weight_bytes / hw.bandwidth, compute) + kv_read * shape.kv_bytes_per_pos / hw.bandwidth
        forwards += 1
        tokens += q_tokens
        if forwards == limit:
            first = total

    if cfg.block_diffusion:
        # the shared block grid (`dllm_rollout.block.grid_layout`): row i keeps p_i // B full prompt
        # blocks in the cache; its prompt tail and the response fill the decode blocks
        full = [p // bl for p in prompt_lens]
        tails = [p % bl for p in prompt_lens]
        decode_blocks = max(math.ceil((t + n) / bl) for t in tails)
        quota = [bl // steps + (1 if s < bl % steps else 0) for s in range(steps)]
        cum = [sum(quota[:s + 1]) for s in range(steps)]

        def steps_for(masks: int) -> int:  # steps until the per-step quota has committed `masks` tokens
            return 0 if masks <= 0 else next((s + 1 for s, c in enumerate(cum) if c >= masks), steps)

        if cfg.cache == "prefix":
            forward(sum(f * bl for f in full), sum(block_pairs(0, f * bl, bl) for f in full), 0)  # prompt blocks
        # with `speed.fold_store` a finished block's store pass is part of the next block's first forward,
        # except the first block's when no row has a full prompt block (that store creates the cache)
        fold = cfg.speed.fold_store and cfg.cache == "prefix"
        pending: tuple[int, int] | None = None  # (pairs, cache reads) of a store pass to fold
        for d in range(decode_blocks):
            masks = [bl - t if d == 0 else bl for t in tails]  # the canvas past the response is denoised too
            ctx = [(f + d) * bl for f in full]  # cached positions before the block
            for s in range(steps_for(max(masks))):
                if cfg.cache == "prefix":
                    q, pairs, kv = rows * bl, sum(bl * (c + bl) for c in ctx), sum(ctx)
                    if pending is not None and s == 0:  # [finished block ; this block]
                        q, pairs, kv, pending = q + rows * bl, pairs + pending[0], pending[1], None
                    forward(q, pairs, kv)
                else:  # recompute: the canvas up to the block's end
                    forward(sum(c + bl for c in ctx), sum(block_pairs(0, c + bl, bl) for c in ctx), 0)
            if cfg.cache == "prefix" and d < decode_blocks - 1:  # the store pass of the finished block
                store = (sum(bl * (c + bl) for c in ctx), sum(ctx))
                if fold and (d > 0 or max(full) > 0):
                    pending = store
                else:
                    forward(rows * bl, *store)
    else:
        blocks = math.ceil(n / bl)
        per_block = max(1, steps // blocks)
        lens = [p + n for p in prompt_lens]
        whole = (sum(lens), sum(x * x for x in lens))  # a full forward: tokens, pairs
        for b in range(blocks):
            for s in range(per_block):
                if cfg.cache is None or s == 0:
                    forward(whole[0], whole[1], 0)
                elif cfg.cache == "prefix":
                    q = rows * (n - b * bl)
                    forward(q, sum((n - b * bl) * x for x in lens), sum(p + b * bl for p in prompt_lens))
                else:  # dual
                    forward(rows * bl, sum(bl * x for x in lens), sum(x - bl for x in lens))
    out = {"floor_s": total, "forwards_formula": forwards, "tokens_formula": tokens}
    if 0 < limit < forwards:
        out["floor_first_s"] = first
    return out


def scored_rows(algorithm: Any, sampling: Any) -> tuple[int, bool]:
    """(scored rows per sequence, block layout) of the update, per algorithm (module docstring)."""
    name = type(algorithm).__name__
    if name == "TraceRL":  # one replay row per merged unmask step (block models: on the BD3LM layout)
        return math.ceil(int(sampling.steps) / int(algorithm.shrink)), bool(sampling.block_diffusion)
    if sampling.block_diffusion:
        return int(getattr(algorithm, "mc_num", 1)), True
    if name == "CJGRPO":
        return int(sampling.steps), False
    if name == "D1":
        return 1, False
    if name == "GDPO":  # one full forward per quadrature node and mask draw
        from dllm_objectives import quadrature_rule

        return len(quadrature_rule(algorithm.rule)[0]) * int(algorithm.mc_samples), False
    raise SystemExit(f"recipe_scale: no required-FLOPs rule for algorithm {name}; add it to scored_rows")


def update_flops(algorithm: Any, sampling: Any, prompt_lens: Sequence[int], shape: Shape) -> tuple[float, float]:
    """(forward-only FLOPs, forward+backward FLOPs) required to score `prompt_lens` rows once."""
    k, block = scored_rows(algorithm, sampling)
    n, bl = sampling.max_new_tokens, sampling.block_length
    tokens = pairs = 0
    for p in prompt_lens:
        if block:  # x_0 once, then k noised responses, BD3LM pairs
            tokens += (p + n) + k * n
            pairs += block_pairs(0, p + n, bl) + k * block_pairs(p, p + n, bl)
        else:
            tokens += k * (p + n)
            pairs += k * (p + n) ** 2
    fwd = 2.0 * shape.params * tokens + 4.0 * shape.q_width_layers * pairs
    return fwd, 3.0 * fwd


# ----------------------------------------------------------------------------- the product's pieces


def text_reward(text: str, key: str) -> float:
    """Deterministic pseudo-random reward of the text: random weights solve nothing, and the
    groups still carry distinct rewards (non-zero advantages)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


class StopDecode(Exception):
    """Raised by `ForwardCounter` at its forward limit (the time-boxed rollout)."""


class ForwardCounter:
    """Counts the policy's decoding forwards and the query tokens they carry; with `limit` > 0 raises
    `StopDecode` before forward `limit + 1`.

    A forward pre-hook on the model sees eager forwards; forwards replayed from a CUDA graph
    (`dllm_rollout.graphs.GraphedStep`) run no Python, so `GraphedStep.__call__` is wrapped for the
    counter's lifetime: one forward per call, the hook silent inside it (its capture runs the model
    twice), and the limit checked before the call, never inside a capture.
    """

    def __init__(self, model: torch.nn.Module, limit: int = 0) -> None:
        from dllm_rollout.graphs import GraphedStep

        self.calls = 0
        self.tokens = 0
        self.limit = limit
        self.inside = False
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)
        self.graphed = GraphedStep
        self.original = GraphedStep.__call__
        counter = self

        def call(step: Any, *inputs: torch.Tensor) -> Any:
            if counter.inside:
                return counter.original(step, *inputs)
            counter._count(inputs[0] if inputs else None)
            counter.inside = True
            try:
                return counter.original(step, *inputs)
            finally:
                counter.inside = False

        GraphedStep.__call__ = call  # type: ignore[method-assign,assignment]

    def _count(self, ids: Any) -> None:
        if self.limit and self.calls == self.limit:
            raise StopDecode
        self.calls += 1
        self.tokens += int(ids.numel()) if isinstance(ids, torch.Tensor) else 0

    def _hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.inside:
            self._count(args[0] if args else kwargs.get("input_ids"))

    def close(self) -> None:
        self.handle.remove()
        self.graphed.__call__ = self.original  # type: ignore[method-assign]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def batch_prompts(data: Sequence[Any], prompts: int, group: int) -> list[Any]:
    """The rollout rows of a step: the first `prompts` prompts of `data` (cycled), each `group` times."""
    return [data[i % len(data)][0] for i in range(prompts) for _ in range(group)]


def timed_rollout(rollout: Any, prompts: Sequence[Sequence[int]], seeds: torch.Tensor, shape: Shape, hw: Hardware,
                  args: argparse.Namespace, device: str, head: dict[str, Any]) -> dict[str, Any]:
    """One rollout of `prompts` through the rollout worker, time-boxed by --max-forwards, against its floor."""
    model = rollout.model
    if args.max_forwards and 0 < rollout.sampling.max_rows < len(prompts):
        raise SystemExit(f"recipe_scale: --max-forwards extrapolates one batch's forwards; rollout.max_rows="
                         f"{rollout.sampling.max_rows} decodes {len(prompts)} rows in chunks: run it without --max-forwards")
    counter = ForwardCounter(model, args.max_forwards)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    was_training = model.training
    batch = None
    _sync()
    t0 = time.perf_counter()
    try:
        batch = rollout.generate(prompts, seeds)
    except StopDecode:  # time-boxed: the first --max-forwards forwards ran
        pass
    finally:
        _sync()
        secs = time.perf_counter() - t0
        counter.close()
        model.train(was_training)
    sampling = rollout.sampling
    lens = [len(p) for p in prompts]
    chunk = sampling.max_rows or len(prompts)  # the decoder runs each chunk of rows on its own
    parts = [decode_floor(sampling, lens[a:a + chunk], shape, hw, limit=args.max_forwards)
             for a in range(0, len(lens), chunk)]
    floor = {k: sum(p[k] for p in parts) for k in parts[0]} if len(parts) > 1 else parts[0]
    label = "rollout" if sampling.block_diffusion and sampling.cache == "prefix" else f"rollout (cache={sampling.cache})"
    if head.get("variant"):
        label += f" [{head['variant']}]"
    row = {**head, "rows": len(prompts), "phase": label, "seconds": secs, **floor, "forwards_counted": counter.calls,
           "tokens_counted": counter.tokens,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}
    if batch is not None:
        row["response_tokens"] = int(batch.response_ids.numel())
    else:  # extrapolated along the floor's shape: seconds x floor(all) / floor(first forwards)
        row.update(measured_s=secs, extrapolated=True, floor_measured_part_s=floor["floor_first_s"],
                   seconds=secs * floor["floor_s"] / floor["floor_first_s"])
    return row


def before_rollout(actor: Any) -> None:
    """What `PolicyRank.rollout_step` does before its rollout: free the spent gradients and, with
    `trainer.optimizer_offload`, move the optimizer state to host memory."""
    actor.release_gradients()
    actor.offload_optimizer()


def warm_rollout(rollout: Any, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> None:
    """A few forwards at the measured batch (autotune, allocator), stopped early."""
    warm = ForwardCounter(rollout.model, 4)
    try:
        rollout.generate(prompts, seeds)
    except StopDecode:
        pass
    finally:
        warm.close()


@dataclasses.dataclass
class RecipeSetup:
    """A recipe's run config on its release-layout folder and the rows its step and update see."""

    recipe: str
    folder: Path
    base: Any  # the recipe's RunConfig before overrides
    overrides: list[str]
    cfg: Any  # the resolved RunConfig (`dare train <recipe> [overrides]`)
    data: list[Any]  # (prompt ids, answer) pairs of `dare.rl_data.rl_prompts`
    prompts_full: list[Any]  # the step's rollout rows: rl.prompts_per_step prompts x group_size
    prompts_update: list[Any]  # the measured update's rows: the first --update-rows of prompts_full

    @property
    def full_rows(self) -> int:
        return len(self.prompts_full)


def recipe_setup(recipe: str, args: argparse.Namespace, device: str) -> RecipeSetup:
    """`recipe`'s config on its release-layout folder (`e2e_gpu.prepare_model`) and its rows: the one
    place the rollout, the update and the DARE peer (`dare_peer_update.py`) take them from."""
    from dare.recipes import get_recipe, resolve
    from dare.rl_data import rl_prompts
    from dllm_models import load_tokenizer

    info = prepare_model(RECIPE_MODELS[recipe], args.checkpoints, args.workdir, tiny=args.tiny, device=device)
    folder = Path(info["folder"])
    base = get_recipe(recipe)
    overrides = [f"checkpoint.checkpoint={folder}", "data.train_files=gsm8k"]
    if args.tiny:
        fields = {f.name for f in dataclasses.fields(base.algorithm)}
        overrides += [o for o in TINY_OVERRIDES["block" if base.rollout.block_diffusion else "masked"]
                      if not o.startswith("algorithm.") or o.split("=")[0].removeprefix("algorithm.") in fields]
    cfg = resolve(base, overrides + list(args.set))
    rl = cfg.rl
    assert rl is not None
    group = rl.group_size
    full_rows = rl.prompts_per_step * group
    if args.update_rows % group or not 0 < args.update_rows <= full_rows:
        raise SystemExit(f"recipe_scale: --update-rows={args.update_rows} must be a positive multiple of the recipe's "
                         f"rl.group_size={group}, at most {full_rows}")
    data = rl_prompts(cfg, load_tokenizer(folder))
    return RecipeSetup(recipe=recipe, folder=folder, base=base, overrides=overrides, cfg=cfg, data=data,
                       prompts_full=batch_prompts(data, rl.prompts_per_step, group),
                       prompts_update=batch_prompts(data, args.update_rows // group, group))


def run_recipe(recipe: str, args: argparse.Namespace, hw: Hardware, device: str, rows: list[dict[str, Any]]) -> None:
    """Append the rows of `recipe` (rollout [lmdeploy], old, reference, update) to `rows` as they come."""
    from dare.pipeline import detokenizer, policy_with_adapters
    from dare.recipes import resolve
    from dare.rl_backend import rl_backend
    from dllm_models import load_tokenizer
    from dllm_train import PromptBatch

    setup = recipe_setup(recipe, args, device)
    folder, base, overrides, cfg, data = setup.folder, setup.base, setup.overrides, setup.cfg, setup.data
    rl, sampling = cfg.rl, cfg.rollout
    assert rl is not None
    group = rl.group_size
    full_rows = setup.full_rows
    tokenizer = load_tokenizer(folder)
    prompts_full = setup.prompts_full
    keys_full = [str(i % len(data)) for i in range(rl.prompts_per_step)]
    update_prompts = args.update_rows // group

    def prompts(step: int) -> PromptBatch:  # the update's rows: the first prompts of the full batch
        return PromptBatch([data[i % len(data)][0] for i in range(update_prompts)], keys_full[:update_prompts], group)

    model = policy_with_adapters(cfg, device)
    raw = json.loads((folder / "config.json").read_text())
    shape = model_shape(model, raw)
    head = {"recipe": recipe, "model": RECIPE_MODELS[recipe], "rows": full_rows, "update_rows": args.update_rows,
            "max_new_tokens": sampling.max_new_tokens, "prompt_len_mean": sum(map(len, prompts_full)) / full_rows}
    seeds = torch.arange(full_rows)

    if args.lmdeploy and sampling.block_diffusion:
        from dllm_train.engine_rollout import EngineRolloutWorker

        worker = EngineRolloutWorker(model, dataclasses.replace(sampling, engine="lmdeploy"), algorithm=cfg.algorithm,
                                     folder=folder)
        worker.generate(prompts_full[:2], seeds[:2])  # starts the engine, warms it
        secs, batch = timed(lambda: worker.generate(prompts_full, seeds))
        eng = dict(worker.last_metrics)
        floor = decode_floor(worker.sampling, [len(p) for p in prompts_full], shape, hw)
        decode_s = float(eng.get("engine_decode_s", secs))
        rows.append({**head, "phase": "rollout (lmdeploy)", "seconds": decode_s, "floor_s": floor["floor_s"],
                     "forwards_formula": floor["forwards_formula"], "call_s": secs,
                     "handoff_s": eng.get("engine_handoff_s"),
                     "response_tokens": int(batch.response_ids.numel())})
        if worker.engine is not None:
            worker.engine.close()
        del worker, batch
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()

    step_cfg = resolve(base, overrides + list(args.set) + list(args.update_set)) if args.update_set else cfg
    step_fn, local, shutdown = rl_backend(step_cfg, model, prompts=prompts, algorithm=step_cfg.algorithm,
                                          reward_fn=text_reward, detokenize=detokenizer(tokenizer), rank_setup=lambda: None)
    try:
        rollout = local.rank.rollout
        if args.update_set:  # the timed rollout keeps the recipe's own settings
            from dllm_train import RolloutWorker

            rollout = RolloutWorker(model, sampling, algorithm=cfg.algorithm, ref_model=local.rank.rollout.ref_model)
            check_update_work(cfg, step_cfg, rollout.sampling, local.rank.rollout.sampling, prompts_full, shape, args)
        if args.rollout_only:  # warm the decoder (autotune, allocator) on a few forwards at the full batch
            warm_rollout(rollout, prompts_full, seeds)
        for w in range(0 if args.rollout_only else args.warmup):  # flex compilation, autotune, optimizer state
            step_fn(w)
        if not args.update_only:
            if args.update_set:
                warm_rollout(rollout, prompts_full, seeds)
            offload_s, _ = timed(lambda: before_rollout(local.rank.actor))
            rows.append({**timed_rollout(rollout, prompts_full, seeds, shape, hw, args, device, head),
                         "optimizer_offload_s": offload_s})
        gc.collect()
        if not args.rollout_only:  # the step on the update rows
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            metrics = step_fn(args.warmup)
            scale = full_rows / args.update_rows
            alg = cfg.algorithm
            fwd, fwd_bwd = update_flops(alg, rollout.sampling, [len(p) for p in prompts_full], shape)
            if args.update_set:
                head = {**head, "update_set": list(args.update_set)}
            iters = int(getattr(alg, "num_iterations", 1))
            # the actor's old pass runs only when the algorithm needs old values the training pass does not give
            old_pass = bool(alg.needs_old) and not bool(getattr(local.actor, "old_from_training_pass", False))
            for phase, key, flops in (("old" if old_pass else "old (prepare only)", "old_s", fwd * iters if old_pass else 0.0),
                                      ("reference", "reference_s", fwd), ("update", "update_s", fwd_bwd * iters)):
                if key not in metrics:
                    continue
                measured = float(metrics[key])
                # the optimizer state's return from host memory is once per step, whatever the rows: not scaled
                once = float(metrics.get("optimizer_restore_s", 0.0)) if phase == "update" else 0.0
                row = {**head, "phase": phase, "seconds": (measured - once) * scale + once, "measured_s": measured,
                       "floor_s": flops / hw.flops, "required_tflop": flops / 1e12,
                       "peak_gib": metrics.get("peak_gib")}
                if phase == "update":
                    row.update({k: metrics[k] for k in ("optimizer_offload_s", "optimizer_restore_s") if k in metrics})
                    row["update_passes"] = metrics.get("update_passes", float("nan")) * scale
                    row["measured_passes"] = metrics.get("update_passes")
                rows.append(row)
            if args.profile:
                rows[-1]["profile"] = profile_update(local, lambda: step_fn(args.warmup + 1), args.profile, device)
        for variant in args.variant:  # rollout-only variants on the same loaded policy (no new folder or load)
            from dllm_train import RolloutWorker

            vcfg = resolve(base, overrides + list(args.set) + [kv for kv in variant.split(",") if kv])
            assert vcfg.rl is not None
            vrows = vcfg.rl.prompts_per_step * vcfg.rl.group_size
            worker = RolloutWorker(model, vcfg.rollout, algorithm=vcfg.algorithm, ref_model=rollout.ref_model)
            vprompts = batch_prompts(data, vcfg.rl.prompts_per_step, vcfg.rl.group_size)
            vseeds = torch.arange(vrows)
            before_rollout(local.rank.actor)
            warm_rollout(worker, vprompts, vseeds)
            vhead = {**head, "variant": variant, "prompt_len_mean": sum(map(len, vprompts)) / vrows,
                     "max_new_tokens": worker.sampling.max_new_tokens}
            rows.append(timed_rollout(worker, vprompts, vseeds, shape, hw, args, device, vhead))
            del worker
            gc.collect()
    finally:
        shutdown()
    del local, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def check_update_work(cfg: Any, step_cfg: Any, sampling: Any, step_sampling: Any, prompts: Sequence[Sequence[int]],
                      shape: Shape, args: argparse.Namespace) -> None:
    """Refuse an `--update-set` that changes the update's required FLOPs (then the update row would
    not be the recipe's): the algorithm and the response length must stay, and `update_flops` agree."""
    lens = [len(p) for p in prompts]
    same = (type(cfg.algorithm) is type(step_cfg.algorithm)
            and sampling.max_new_tokens == step_sampling.max_new_tokens
            and update_flops(cfg.algorithm, sampling, lens, shape) == update_flops(step_cfg.algorithm, step_sampling, lens, shape))
    if not same:
        raise SystemExit(f"recipe_scale: --update-set {args.update_set} changes the update's required work "
                         "(algorithm, response length or scored rows); use --set to change the whole recipe")


ATTENTION_KERNELS = ("flex_attention", "bd3lm", "flash", "attn_fwd", "attn_bwd", "_fwd_kernel", "_bwd_kernel")
GEMM_KERNELS = ("nvjet", "gemm", "cutlass", "sm90_xmma", "cublas")


def kernel_group(name: str) -> str:
    """The group of a CUDA kernel's name in `--profile`'s summary."""
    low = name.lower()
    if any(k in low for k in ATTENTION_KERNELS):
        return "attention backward" if "backward" in low or "bwd" in low or "dq" in low or "dkdv" in low \
            else "attention forward"
    if any(k in low for k in GEMM_KERNELS):
        return "GEMM"
    if "adam" in low or "multi_tensor" in low or "foreach" in low:
        return "optimizer"
    return "other (norms, RoPE, SwiGLU, head, copies)"


def profile_update(local: Any, step: Callable[[], Any], top: int, device: str) -> dict[str, Any]:
    """One more step with the actor's `update` under `torch.profiler`: its top kernels and their groups."""
    actor = local.rank.actor
    original = actor.update
    holder: dict[str, Any] = {}

    def update(*a: Any, **k: Any) -> Any:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        _sync()
        with torch.profiler.profile(activities=acts) as prof:
            out = original(*a, **k)
            _sync()
        holder["prof"] = prof
        return out

    actor.update = update
    try:
        step()
    finally:
        actor.update = original
    prof = holder["prof"]
    attr = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0
              and (device != "cuda" or e.device_type == torch.autograd.DeviceType.CUDA)]
    total = sum(getattr(e, attr) for e in events) or 1.0
    groups: dict[str, float] = {}
    for e in events:
        g = kernel_group(e.key)
        groups[g] = groups.get(g, 0.0) + getattr(e, attr) / 1e6
    ranked = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:top]
    planner = getattr(local.rank.actor.model, "activation_planner", None)
    out = {"device_s": total / 1e6, "groups_s": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
           "top": [{"kernel": e.key[:90], "s": getattr(e, attr) / 1e6, "calls": e.count} for e in ranked],
           "checkpointed_layers_last_forward": getattr(planner, "last_checkpointed", None)}
    print(f"profile of the update ({out['device_s']:.2f} s of device time; last training forward checkpointed "
          f"{out['checkpointed_layers_last_forward']} layers):", flush=True)
    for g, sec in out["groups_s"].items():
        print(f"  {g:45s} {sec:8.2f} s  {100 * sec * 1e6 / total:5.1f} %")
    for t in out["top"]:
        print(f"  {t['s']:8.3f} s  {t['calls']:6d}  {t['kernel']}")
    return out


PEER_RECIPES = frozenset({"sdar-bgpo"})  # the recipes with a DARE peer update (dare_peer_update.py)


def run_peer(recipe: str, args: argparse.Namespace, hw: Hardware, device: str, rows: list[dict[str, Any]]) -> None:
    """Append DARE's own old pass and update of `recipe` on the same rows (`dare_peer_update.peer_rows`)."""
    from dare_peer_update import peer_rows
    from dare_remote import load_dare

    dare = load_dare(args.peer_dare_root, cpu_attention=device == "cpu")
    rows.extend(peer_rows(recipe_setup(recipe, args, device), dare, hw, device))


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows."""
    out = ["| recipe | phase | rows | new | seconds | floor s | floor / measured | passes | forwards (formula / counted) | peak GiB |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['recipe']} | {r['phase']}: {r['error']} | | | | | | | | {r.get('peak_gib', 0):.1f} |")
            continue
        passes = f"{r['update_passes']:.0f} ({r['measured_passes']:.0f} on {r['update_rows']} rows)" \
            if "update_passes" in r else ""
        fwd = f"{r['forwards_formula']} / {r.get('forwards_counted', '-')}" if "forwards_formula" in r else ""
        if r.get("extrapolated"):
            fwd += " (extrapolated)"
        rows_n = r["rows"] if r["phase"].startswith("rollout") else f"{r['rows']} (x{r['rows'] / r['update_rows']:g} of {r['update_rows']})"
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else ""
        ratio = f"{r['floor_over_measured']:.3g}" if r["floor_s"] > 0 else "- (no required work)"
        out.append(f"| {r['recipe']} | {r['phase']} | {rows_n} | {r['max_new_tokens']} | {r['seconds']:.2f} | "
                   f"{r['floor_s']:.3g} | {ratio} | {passes} | {fwd} | {peak} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default="sdar-bgpo,llada-d1,llada-cj-grpo,dream-d1")
    ap.add_argument("--update-rows", type=int, default=8, help="rows of the measured update (a multiple of group_size)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps on the update rows (default: 1 on CUDA, 0 tiny)")
    ap.add_argument("--max-forwards", type=int, default=0,
                    help="time-box the native rollout: stop after this many forwards and extrapolate (0: full decode)")
    ap.add_argument("--lmdeploy", action="store_true", help="also the block families' rollout through lmdeploy")
    ap.add_argument("--rollout-only", action="store_true",
                    help="the rollout alone (no warm-up step, no update): decode figures, e.g. per rollout.cache")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="after the recipe's rows, one more rollout (no update) with these overrides on the same "
                         "loaded policy, e.g. rollout.cache=dual,rl.prompts_per_step=8; repeatable")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a dotted override applied after the recipe's (as on `dare train`), repeatable")
    ap.add_argument("--update-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of the measured step only (not the timed rollout), refused where it changes "
                         "the update's required work, e.g. rollout.steps=16 for llada-d1; repeatable")
    ap.add_argument("--update-only", action="store_true", help="skip the timed full-batch rollout")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="one more step with the update under torch.profiler: print its top N kernels and groups")
    ap.add_argument("--peer-dare-root", type=Path, default=None, metavar="PATH",
                    help=f"a checkout of yjyddq/DARE: after {', '.join(sorted(PEER_RECIPES))}'s rows, DARE's own old pass "
                         "and update on the same rows (dare_peer_update.py)")
    ap.add_argument("--tflops", type=float, default=790.0, help="bf16 dense matmul rate, TFLOP/s (docs/benchmarks.md: ~790 measured)")
    ap.add_argument("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth, TB/s (H200 datasheet 4.8)")
    ap.add_argument("--checkpoints", type=Path, default=None, help="release configs/tokenizers (default: the shared checkpoints beside the repository, else .devshare)")
    ap.add_argument("--workdir", type=Path, default=None, help="model folders (default /dev/shm/recipe_scale; tiny: a temp dir)")
    ap.add_argument("--tiny", action="store_true", help="2-layer models, short responses, CPU")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    unknown = [r for r in args.recipes.split(",") if r not in RECIPE_MODELS]
    if unknown:
        raise SystemExit(f"recipe_scale: unknown recipe(s) {unknown}; choose from {sorted(RECIPE_MODELS)}")
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    args.warmup = args.warmup if args.warmup is not None else (0 if args.tiny else 1)
    args.checkpoints = args.checkpoints or _default_dir("checkpoints")
    hw = Hardware(flops=args.tflops * 1e12, bandwidth=args.hbm_tbs * 1e12)
    tmp = tempfile.TemporaryDirectory() if args.tiny and args.workdir is None else None
    args.workdir = args.workdir or (Path(tmp.name) if tmp else Path("/dev/shm/recipe_scale"))
    rows: list[dict[str, Any]] = []
    try:
        for recipe in args.recipes.split(","):
            start = len(rows)
            try:
                run_recipe(recipe, args, hw, device, rows)
                if args.peer_dare_root is not None and recipe in PEER_RECIPES:
                    run_peer(recipe, args, hw, device, rows)
            except torch.cuda.OutOfMemoryError as err:  # the recipe's own batch may not fit: that is a result
                phase = "after " + rows[-1]["phase"] if len(rows) > start else "before the rollout"
                rows.append({"recipe": recipe, "phase": phase, "error": "out of memory",
                             "detail": str(err).splitlines()[0][:200],
                             "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
            gc.collect()  # after the handler: the traceback held the recipe's model
            if device == "cuda":
                torch.cuda.empty_cache()
            for r in rows[start:]:
                if "error" not in r:
                    r["floor_over_measured"] = r["floor_s"] / r["seconds"] if r["seconds"] > 0 else float("nan")
                print(json.dumps(r), flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"\ndevice={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} torch={torch.__version__} "
          f"matmul={args.tflops:g} TFLOP/s HBM={args.hbm_tbs:g} TB/s{' (tiny: floors are H200 figures, not CPU)' if args.tiny else ''}")
    print(table(rows))
    target = args.json or (Path(os.environ["OUT"]) / "recipe_scale.json" if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

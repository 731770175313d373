"""One RL iteration at real shapes, through the product's step (`dllm_train.LocalRL.step`).

Random bf16 weights at the released shapes (benchmarks/configs/<name>/config.json), one GPU,
`--prompts` x `--group` sequences (default 8 x 8), prompts of 128..256 random tokens, `--new-tokens`
new tokens (default 256). The step is exactly what `dare train` runs: the rollout worker decodes
(`--cache`), the reward worker scores (a deterministic pseudo-random reward of the text, so
groups carry signal), the actor prepares (the algorithm's noise, old values) and updates in
token-budget passes (`--max-tokens-per-pass`), with the trainer's training attention
(`--train-attention auto`: varlen for LLaDA, flex BD3LM for SDAR) and memory levers. Nothing is
re-implemented here: the figures are the product's.

Per configuration it runs `--steps` steps (the first warms up: flex compilation, Triton autotune,
optimizer state) and prints the last step's split: rollout, old, reference and update seconds,
peak GiB, and the number of forward passes of the update. `--budgets 0,16384` compares one
forward per scorer call ("before": what the trainer did without a token budget) with a budget.
`--layouts shared,doubled` compares the block families' shared-clean BD3LM layout (the default:
the Monte-Carlo copies of a sequence share one clean half) with the doubled one
(`trainer.bd3lm_layout`), in the same call.

    python benchmarks/rl_iteration_bench.py --models SDAR-8B-Chat --algorithm bgpo --budgets 0,16384
    python benchmarks/rl_iteration_bench.py --models SDAR-8B-Chat --algorithm bgpo --prompts 1 --group 8 \
        --new-tokens 2048 --budgets 16384 --checkpointing --layouts doubled,shared   # sdar-bgpo, 8 rows
    python benchmarks/rl_iteration_bench.py --models LLaDA-8B-Instruct --algorithm d1 --cache dual
    uv run python benchmarks/rl_iteration_bench.py --tiny       # CPU smoke run (2 layers)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rollout_bench import _model  # noqa: E402

from dllm_rollout import SamplingConfig  # noqa: E402
from dllm_train import LocalRL, OptimConfig, PromptBatch, TrainerConfig  # noqa: E402


def algorithm_named(name: str) -> Any:
    """The registry's algorithm (imported lazily: the app's registry is the one users run)."""
    from dare.algorithms import get_algorithm

    return get_algorithm(name)


def text_reward(text: str, answer: str) -> float:
    """A deterministic pseudo-random reward in [0, 1) of the decoded text (random weights never
    solve anything; this gives every group distinct rewards, hence non-zero advantages)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


def prompt_sampler(batch: int, group: int, max_len: int, vocab: int) -> Any:
    """step -> PromptBatch of `batch` random prompts of max_len/2..max_len tokens."""
    def sample(step: int) -> PromptBatch:
        g = torch.Generator().manual_seed(1000 + step)
        lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=g).tolist()
        ids = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
        return PromptBatch(ids, ["" for _ in ids], group)
    return sample


def sampling_for(model: Any, args: argparse.Namespace) -> SamplingConfig:
    block = model.traits.block_length
    cache = None if args.cache == "none" else args.cache
    if block is not None:
        return SamplingConfig(max_new_tokens=args.new_tokens, block_length=block, steps=block, block_diffusion=True,
                              temperature=1.0, top_k=50, stop_at_eos=False, cache=cache, max_rows=args.max_rows)
    blk = 32 if not args.tiny else 8
    return SamplingConfig(max_new_tokens=args.new_tokens, block_length=blk, steps=args.new_tokens // 2,
                          temperature=0.6, cache=cache, max_rows=args.max_rows)


def run(name: str, budget: int, layout: str, args: argparse.Namespace, device: str,
        dtype: torch.dtype) -> dict[str, Any]:
    model = _model(name, args.tiny, device, dtype)
    vocab = min(int(model.get_output_embeddings().weight.shape[0]), 100_000)
    algorithm = algorithm_named(args.algorithm)
    if args.mc_num and hasattr(algorithm, "mc_num"):
        algorithm = dataclasses.replace(algorithm, mc_num=args.mc_num)
    trainer = TrainerConfig(max_steps=args.steps, train_attention=args.train_attention, max_tokens_per_pass=budget,
                            bd3lm_layout=layout, activation_checkpointing=args.checkpointing,
                            reference_offload=args.reference_offload)
    rl = LocalRL(model, prompts=prompt_sampler(args.prompts, args.group, args.prompt_len, vocab),
                 sampling=sampling_for(model, args), reward_fn=text_reward, detokenize=lambda ids: " ".join(map(str, ids)),
                 algorithm=algorithm, optim=OptimConfig(lr=1e-6, grad_clip=1.0), trainer=trainer)
    row: dict[str, Any] = {"model": name, "algorithm": args.algorithm, "max_tokens_per_pass": budget,
                           "bd3lm_layout": layout,
                           "train_attention": args.train_attention, "cache": args.cache,
                           "checkpointing": args.checkpointing}
    try:
        for step in range(args.steps):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            metrics = rl.step(step)
            row.update({k: metrics[k] for k in ("rollout_s", "old_s", "reference_s", "update_s", "peak_gib",
                                                "update_passes", "loss", "grad_norm") if k in metrics},
                       step_s=time.perf_counter() - t0)
    except torch.cuda.OutOfMemoryError as err:
        row.update(error="out of memory", detail=str(err).splitlines()[0][:200],
                   peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    print(json.dumps(row), flush=True)
    del rl, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="SDAR-8B-Chat")
    ap.add_argument("--algorithm", default="bgpo")
    ap.add_argument("--mc-num", type=int, default=0, help="override the algorithm's Monte-Carlo budget (0: its own)")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--cache", default="prefix", help="rollout cache: none, prefix, dual")
    ap.add_argument("--max-rows", type=int, default=0, help="rollout.max_rows")
    ap.add_argument("--train-attention", default="auto")
    ap.add_argument("--budgets", default="16384", help="comma-separated trainer.max_tokens_per_pass values")
    ap.add_argument("--layouts", default="shared", help="comma-separated trainer.bd3lm_layout values (shared, doubled)")
    ap.add_argument("--checkpointing", action="store_true", help="trainer.activation_checkpointing")
    ap.add_argument("--reference-offload", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if args.tiny:
        args.prompts, args.group, args.prompt_len, args.new_tokens = 2, 2, 16, 16
        args.train_attention = "sdpa" if args.train_attention == "auto" else args.train_attention
    rows = [run(name.strip(), int(b), layout.strip(), args, device, dtype) for name in args.models.split(",")
            for b in args.budgets.split(",") for layout in args.layouts.split(",")]
    print(f"\ndevice={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} torch={torch.__version__}")
    print(f"{'model':20s} {'alg':8s} {'budget':>7s} {'layout':>7s} {'rollout':>8s} {'old':>6s} {'ref':>6s} {'update':>7s} "
          f"{'step s':>7s} {'passes':>6s} {'peak GiB':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:20s} {r['algorithm']:8s} {r['max_tokens_per_pass']:7d} {r['bd3lm_layout']:>7s}  {r['error']} "
                  f"(peak {r.get('peak_gib', 0):.1f} GiB)")
            continue
        peak = f"{r['peak_gib']:8.1f}" if "peak_gib" in r else f"{'-':>8s}"
        print(f"{r['model']:20s} {r['algorithm']:8s} {r['max_tokens_per_pass']:7d} {r['bd3lm_layout']:>7s} "
              f"{r.get('rollout_s', 0):8.2f} "
              f"{r.get('old_s', 0):6.2f} {r.get('reference_s', 0):6.2f} {r.get('update_s', 0):7.2f} "
              f"{r['step_s']:7.2f} {r.get('update_passes', 0):6.0f} {peak}")
    target = args.json or (os.path.join(os.environ["OUT"], "rl_iteration_bench.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

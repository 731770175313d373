"""Does each RL algorithm raise held-out accuracy on the quick-start task? (CPU)

Starts every LLaDA-family algorithm from the same warm start (the quick start's model after its
300 SFT steps, 41.0 % held-out), runs N RL steps with the quick start's rollout and batch shape,
and prints greedy exact match on the 500 held-out prompts before and after.

    uv run python benchmarks/algorithm_learning.py --steps 60 [--algorithms d1,bgpo]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
import zlib
from typing import Any

import torch

from dare.algorithms import ALGORITHMS, build_objective, get_algorithm
from dare.config import apply_overrides
from dare.quickstart import build_tiny_model, evaluate_accuracy
from dare.recipes import quickstart
from dare.tasks.addition import AdditionTask, build_tokenizer, exact_match_reward
from dllm_train import PromptBatch, SFTWorker, derive_seed, local_rl_workflow

# Monte-Carlo budgets / iterations reduced so every algorithm's step costs a few forwards
BUDGET = {"bgpo": {"mc_num": 4}, "espo": {"mc_num": 2, "num_iterations": 2}, "mdpo": {"top_k_steps": 2},
          "d-treerpo": {"branching": 2, "depth": 2, "num_iterations": 2}, "justgrpo": {"chunk_size": 4}}
SAMPLING = {"justgrpo": {"block_length": 1}}


def _coin_flip(text: str, answer: str) -> float:
    """A reward with the task's spread but no information about correctness."""
    return float(zlib.crc32(text.encode()) % 2)


def warm_start(lr: float = 3e-5) -> tuple[Any, ...]:
    """(cfg, tokenizer, task, model after the quick start's SFT phase, its held-out accuracy).

    Runs on one torch thread, like the quick start (`trainer.num_threads=1`): the SFT trajectory,
    hence the warm start's accuracy, depends on the reduction order of the thread count.
    """
    cfg = apply_overrides(quickstart(), [f"rl_optim.lr={lr}"])
    torch.set_num_threads(cfg.trainer.num_threads)
    tok = build_tokenizer()
    task = AdditionTask(cfg.task, tok)
    model = build_tiny_model(cfg, tok)
    sft = SFTWorker(model, lambda s: task.sft_batch(cfg.sft.batch_size, derive_seed(0, "sft-data", s)),
                    cfg.sft, cfg.sft_optim, seed=0)
    for s in range(cfg.sft.steps):
        sft.step(s)
    return cfg, tok, task, model, evaluate_accuracy(model, task, cfg)


def learning_run(name: str, warm: tuple[Any, ...], *, steps: int, control: bool = False) -> tuple[float, float, list[float], float]:
    """(accuracy before, after, per-step mean rewards, seconds per step) of `steps` RL steps of `name`."""
    cfg, tok, task, warm_model, before = warm
    torch.set_num_threads(1)

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(cfg.rl.prompts_per_step, derive_seed(0, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], cfg.rl.group_size)

    model = copy.deepcopy(warm_model)
    entry = dataclasses.replace(get_algorithm(name), **BUDGET.get(name, {}))  # type: ignore[type-var]
    wf = local_rl_workflow(
        model, prompts=prompts, sampling=dataclasses.replace(cfg.rollout, **SAMPLING.get(name, {})),
        reward_fn=_coin_flip if control else exact_match_reward, detokenize=tok.decode,
        objective=build_objective(name, cfg.rl, entry), optim=cfg.rl_optim,
        trainer=dataclasses.replace(cfg.trainer, consistency_every=0), rl=cfg.rl,
    )
    t0 = time.perf_counter()
    rewards = [wf.step(step)["reward_mean"] for step in range(steps)]
    per_step = (time.perf_counter() - t0) / steps
    return before, evaluate_accuracy(model, task, cfg), rewards, per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--control", action="store_true",
                    help="replace the reward by a coin flip keyed on the response text (no task signal): "
                         "what the same number of updates does without a reward signal")
    ap.add_argument("--algorithms", default=",".join(sorted(n for n, e in ALGORITHMS.items() if "llada" in e.families)))
    args = ap.parse_args()
    torch.set_num_threads(1)
    warm = warm_start(args.lr)
    print(f"warm start (SFT {warm[0].sft.steps} steps): {100 * warm[4]:.1f} %", flush=True)
    print(f"{'algorithm':12s} {'before':>7s} {'after':>7s} {'reward first10':>15s} {'reward last10':>14s} {'s/step':>7s}")
    for name in args.algorithms.split(","):
        before, after, rewards, per_step = learning_run(name, warm, steps=args.steps, control=args.control)
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        print(f"{name:12s} {100 * before:6.1f}% {100 * after:6.1f}% {first:15.3f} {last:14.3f} {per_step:7.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Accuracy cost of confidence-threshold parallel decoding on a task (CPU).

Decodes the quick start's held-out addition prompts with a trained checkpoint, greedy, once with
the fixed quota (one token per step) and once per confidence threshold, and prints exact-match
accuracy and the mean number of denoising steps (model forwards) per block.

    uv run python benchmarks/threshold_accuracy.py runs/<quickstart run>/model
"""

from __future__ import annotations

import argparse
import time

import torch

from dare.tasks.addition import AdditionConfig, AdditionTask, exact_match_reward
from dllm_models import load_model, load_tokenizer
from dllm_rollout import SamplingConfig, decode, left_pad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--thresholds", default="0.5,0.7,0.9,0.95,0.99")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.checkpoint)
    tok = load_tokenizer(args.checkpoint)
    task = AdditionTask(AdditionConfig(), tok)
    ids, mask = left_pad([task.encode(task.prompt(a, b)) for a, b in task.eval_pairs], model.traits.pad_token_id)
    answers = [task.answer(a, b) for a, b in task.eval_pairs]
    n = task.cfg.answer_length
    rows = []
    for thr in [None, *[float(t) for t in args.thresholds.split(",")]]:
        cfg = SamplingConfig(max_new_tokens=n, steps=n, block_length=n, threshold=thr, record_trajectory=True)
        t0 = time.perf_counter()
        out = decode(model, ids, mask, torch.zeros(len(answers), dtype=torch.long), cfg)
        wall = time.perf_counter() - t0
        acc = sum(exact_match_reward(tok.decode(r), a) for r, a in zip(out.response_ids.tolist(), answers)) / len(answers)
        assert out.unmask_step is not None
        steps = float((out.unmask_step.max(dim=1).values + 1).float().mean())
        rows.append((("quota (1 token/step)" if thr is None else f"threshold {thr}"), acc, steps, wall))
    print(f"{'decoding':24s} {'accuracy':>9s} {'steps/sample':>13s} {'wall s':>7s}")
    for name, acc, steps, wall in rows:
        print(f"{name:24s} {100 * acc:8.1f}% {steps:13.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()

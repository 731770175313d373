"""Held-out validation during training, through the same evaluators as `dare eval`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from dllm_eval import get_benchmark, get_preset, infer_family, resolve_decoding, run_benchmark
from dllm_rollout import SamplingConfig

logger = logging.getLogger(__name__)

VALIDATION_FROM_ROLLOUT = ("max_new_tokens", "steps", "block_length")
"""The SamplingConfig fields held-out validation takes from the run's rollout; the others (greedy,
cache, per-family temperature and top-p) are the evaluation preset's, resolved as `dare eval` resolves them
(`dllm_eval.resolve_decoding`)."""


def benchmark_validator(
    model: Any,
    tokenizer: Any,
    benchmarks: Sequence[str],
    *,
    limit: int | None,
    preset: str = "dare_local",
    batch_size: int = 16,
    seed: int = 0,
    rollout: SamplingConfig | None = None,
) -> Callable[[], dict[str, float]]:
    """An `eval_fn` for a training phase: held-out accuracy on dllm_eval benchmarks.

    Scores come from `dllm_eval.run_benchmark` (the same prompts, decoding and verifiers as
    `dare eval`), so the validation curve of a run and a later evaluation are comparable. Each
    validation scores the first `limit` rows of every benchmark (the caller chooses: a whole
    benchmark at every `eval_every` can cost more than the training steps between them).

    Args:
        model, tokenizer: the policy being trained and its chat tokenizer.
        benchmarks: benchmark names (see `dllm_eval.BENCHMARKS`).
        limit: score the first N rows of each benchmark (the same rows at every validation);
            None: every row. No default: the caller states it (dare: `data.eval_max_rows`).
        preset: evaluation protocol preset.
        batch_size: prompts per generation call.
        seed: base seed of the per-sample seeds.
        rollout: the run's rollout settings: each benchmark decodes with its preset's settings at
            the rollout's lengths (`VALIDATION_FROM_ROLLOUT`); None: the preset's.

    Returns:
        A callable returning {"eval/<name>_accuracy": ..., "eval/<name>_score": ...}.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (rows per benchmark) or None (every row), got {limit}")
    resolved = get_preset(preset)
    benches = [get_benchmark(b) for b in benchmarks]
    logger.info("validation scores %s of %s", "every row" if limit is None else f"the first {limit} rows",
                ", ".join(b.name for b in benches))

    family = infer_family(model)

    def settings(bench: Any) -> SamplingConfig:
        lengths = {k: getattr(rollout, k) for k in VALIDATION_FROM_ROLLOUT} if rollout is not None else None
        return resolve_decoding(bench, resolved, family=family, block_length=model.traits.block_length,
                                overrides=lengths)

    def validate() -> dict[str, float]:
        was_training = model.training
        model.eval()
        out: dict[str, float] = {}
        for bench in benches:
            result = run_benchmark(model, tokenizer, bench, preset=resolved, batch_size=batch_size,
                                   limit=limit, seed=seed, decoding=settings(bench), hash_weights=False)
            out[f"eval/{bench.name}_accuracy"] = result.accuracy
            out[f"eval/{bench.name}_score"] = result.mean_score
        model.train(was_training)
        return out

    return validate

"""``DLLMRewardEvaluator``: scores OpenCompass predictions with ``dllm_eval``'s reward router.

Only importable inside the ``envs/opencompass`` environment (imports opencompass). It never
downloads anything (OpenCompass's ``AccEvaluator`` loads a metric from the model hub).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from opencompass.openicl.icl_evaluator import BaseEvaluator  # type: ignore[import-not-found,unused-ignore]
from opencompass.registry import ICL_EVALUATORS  # type: ignore[import-not-found,unused-ignore]

from dllm_eval.benchmarks import get_benchmark
from dllm_eval.data import Row
from dllm_eval.presets import get_preset

__all__ = ["DLLMRewardEvaluator"]


@ICL_EVALUATORS.register_module()
class DLLMRewardEvaluator(BaseEvaluator):  # type: ignore[misc,unused-ignore]
    """``Benchmark.reward`` per prediction (the same rule as ``dllm_eval.score`` / the native
    runner; GSM8K extraction from the preset). Reports ``accuracy`` (fully correct, %) and
    ``score`` (mean reward incl. partial credit, %), with per-sample details.

    Args:
        benchmark: ``dllm_eval`` benchmark name.
        preset: preset name (GSM8K extraction).
        workers: scoring threads (code rewards run in the sandbox).
    """

    def __init__(self, benchmark: str, preset: str = "dare_local", workers: int = 4,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.benchmark = get_benchmark(benchmark)
        self.preset = get_preset(preset)
        self.workers = max(1, workers)

    def score(self, predictions: Sequence[str], references: Sequence[str],
              test_set: Any) -> dict[str, Any]:
        if len(predictions) != len(references):
            return {"error": "predictions and references have different lengths"}
        rows = [
            Row(index=int(ex["index"]), data_source=ex["data_source"], prompt=(),
                ground_truth=ref, extra_info=json.loads(ex["extra_info"]))
            for ex, ref in zip(test_set, references)
        ]
        preds = [p if isinstance(p, str) else str(p) for p in predictions]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            rewards = list(pool.map(
                lambda pr: self.benchmark.reward(pr[0], pr[1], self.preset), zip(preds, rows)))
        n = max(1, len(rewards))
        details = [
            {"index": row.index, "pred": rw.pred, "answer": row.ground_truth,
             "score": rw.score, "correct": bool(rw.acc >= 1.0), "prediction": pred}
            for row, rw, pred in zip(rows, rewards, preds)
        ]
        return {
            "accuracy": 100.0 * sum(r.acc for r in rewards) / n,
            "score": 100.0 * sum(r.score for r in rewards) / n,
            "num_samples": len(rewards),
            "details": details,
        }

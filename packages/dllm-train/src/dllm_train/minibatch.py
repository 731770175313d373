"""Mini-batches of one update iteration: a prepared batch cut into the rows of each optimizer step.

`RLAlgorithm.mini_batch_rows` says how many rows one optimizer step reads; each mini-batch is the
prepared batch with the algorithm's data restricted to its rows (`RLAlgorithm.select_rows`) and
its old and reference values sliced to the same rows. Old values stay those computed before the
first step, so every mini-batch after the first is off-policy.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from dllm_train.algorithm import Prepared, RLAlgorithm, mini_batch_slices

D = TypeVar("D")


def mini_batches(algorithm: RLAlgorithm[D], prepared: Prepared[D]) -> list[Prepared[D]]:
    """The prepared batch of every optimizer step of one iteration, in order.

    Args:
        algorithm: says the rows of one step (`mini_batch_rows`) and how to cut its data.
        prepared: the batch with its old values (one entry per iteration, rows first).

    Returns:
        `[prepared]` for `mini_batch_rows="all"`; otherwise one `Prepared` per slice of
        `mini_batch_slices`, without `old_outputs` (raw outputs of all rows).
    """
    slices = mini_batch_slices(algorithm, prepared.batch, prepared.data)
    if slices == [slice(None)]:
        return [prepared]
    return [dataclasses.replace(
        prepared, data=algorithm.select_rows(prepared.data, rows),
        old=[v[rows] for v in prepared.old] if prepared.old is not None else None, old_outputs=None,
        ref=[v[rows] for v in prepared.ref] if prepared.ref is not None else None) for rows in slices]


def mean_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Every key's mean over the optimizer steps that report it (a skipped step may lack some)."""
    keys = list(dict.fromkeys(k for p in parts for k in p))
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


__all__ = ["mean_metrics", "mini_batches"]

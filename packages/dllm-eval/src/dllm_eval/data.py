"""Load the benchmark test rows shipped as package data (``dllm_eval/data/*.parquet``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

__all__ = ["DATASETS", "Message", "Row", "load_rows"]

Message = dict[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""

DATASETS: tuple[str, ...] = (
    "gsm8k", "math500", "countdown", "sudoku", "humaneval", "humanevalplus", "mbpp",
    "aime2024", "aime2025",
)
"""Shipped test sets (full DARE RL test splits; see the package README for provenance)."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One test example in the RL parquet schema (docs/data.md#rl-parquet), flattened."""

    index: int
    data_source: str
    prompt: tuple[Message, ...]
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


def load_rows(name: str, *, limit: int | None = None) -> list[Row]:
    """Test rows of a shipped dataset, in file order.

    Args:
        name: one of :data:`DATASETS`.
        limit: keep only the first ``limit`` rows (None = all).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid: {list(DATASETS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    path = resources.files("dllm_eval") / "data" / f"{name}.parquet"
    with resources.as_file(path) as p:
        table = pq.read_table(p)
    if limit is not None:
        table = table.slice(0, limit)
    cols = table.to_pydict()
    return [
        Row(
            index=i,
            data_source=cols["data_source"][i],
            prompt=tuple(json.loads(cols["prompt"][i])),
            ground_truth=cols["ground_truth"][i],
            extra_info=json.loads(cols["extra_info"][i]),
        )
        for i in range(table.num_rows)
    ]

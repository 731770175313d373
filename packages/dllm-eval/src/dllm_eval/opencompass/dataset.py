"""``DLLMJsonlDataset``: a local jsonl written by :mod:`dllm_eval.opencompass.configs`.

Only importable inside the ``envs/opencompass`` environment (imports opencompass).
"""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset  # type: ignore[import-not-found,unused-ignore]
from opencompass.datasets.base import BaseDataset  # type: ignore[import-not-found,unused-ignore]
from opencompass.registry import LOAD_DATASET  # type: ignore[import-not-found,unused-ignore]

__all__ = ["SAMPLE_COLUMN", "TURN_PREFIX", "DLLMJsonlDataset"]

TURN_PREFIX = "dllm_turn_"
"""Columns ``dllm_turn_0 .. dllm_turn_{k-1}`` hold the text of each chat turn."""

SAMPLE_COLUMN = "dllm_sample"
"""Sample index (row index + replica * rows), the per-sample seed offset."""


@LOAD_DATASET.register_module()
class DLLMJsonlDataset(BaseDataset):  # type: ignore[misc,unused-ignore]
    """Rows of one benchmark under one preset, one JSON object per line (absolute path)."""

    @staticmethod
    def load(path: str, **kwargs: Any) -> Dataset:  # type: ignore[override,unused-ignore]
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return Dataset.from_list(rows)

    def _init_reader(self, **kwargs: Any) -> None:
        # OpenCompass fills the prompt template with str.replace over the row's columns in
        # column order, so text substituted early could be rewritten by a later column (a
        # code prompt containing "{idx}"). Put the turn texts last and add the sample index.
        ds: Any = getattr(self, "dataset")
        turns = sorted((c for c in ds.column_names if c.startswith(TURN_PREFIX)),
                       key=lambda c: int(c[len(TURN_PREFIX):]))
        others = [c for c in ds.column_names if c not in turns and c != SAMPLE_COLUMN]
        data = {c: ds[c] for c in others}
        data[SAMPLE_COLUMN] = [str(i) for i in range(len(ds))]
        data.update({c: ds[c] for c in turns})
        self.dataset = Dataset.from_dict(data)
        super()._init_reader(**kwargs)

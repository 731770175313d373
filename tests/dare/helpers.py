"""The tiny quick-start configuration of the app's tests (and the addition task they use)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dare.config import RunConfig, apply_overrides
from dare.recipes import quickstart
from dare.tasks.addition import AdditionConfig, AdditionTask, build_tokenizer
from tests.tiny_rl import reproducible

TINY = [
    "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.mlp_hidden_size=64",
    "task.num_eval=20", "sft.steps=3", "sft.batch_size=8", "rl.prompts_per_step=2",
    "rl.group_size=4", "trainer.max_steps=4", "trainer.eval_every=0", "trainer.save_every=0",
    "rl_optim.lr=1e-3",
]
"""Overrides that shrink the quick start to a few seconds."""

TASK = AdditionTask(AdditionConfig(digits=3, num_eval=20, seed=1234), build_tokenizer())
"""3-digit addition with 20 held-out pairs."""


def tiny_config(*extra: str) -> RunConfig:
    """The quick-start recipe with `TINY` and `extra` overrides applied."""
    cfg: RunConfig = apply_overrides(quickstart(), [*TINY, *extra])
    return cfg


def addition_rl_parquet(path: Path, pairs: list[tuple[int, int]]) -> Path:
    """A DARE-format RL parquet of two-digit additions ("12+34=" -> "46") at `path`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "data_source": ["gsm8k"] * len(pairs),
        "prompt": [[{"role": "user", "content": f"{a:02d}+{b:02d}="}] for a, b in pairs],
        "reward_model": [{"ground_truth": str(a + b)} for a, b in pairs],
    }), path)
    return path


def measured(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl without what a rerun cannot reproduce (`tiny_rl.reproducible`)."""
    return [reproducible(json.loads(line)) for line in path.read_text().splitlines()]


__all__ = ["TASK", "TINY", "addition_rl_parquet", "measured", "tiny_config"]

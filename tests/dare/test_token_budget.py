"""`dare train` with a token budget: the quick start at `trainer.max_tokens_per_pass=32` (its rows
are about 13 tokens: two rows per forward) trains exactly as with one forward per pass: the same
per-step reward and, within float32 accumulation noise, the same loss and gradient norm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dare.cli import main
from tests.dare.helpers import TINY


def _metrics(tmp: Path, algorithm: str, budget: int) -> list[dict[str, float]]:
    out = tmp / f"{algorithm}-{budget}"
    code = main(["train", *TINY, f"algorithm={algorithm}", "trainer.max_steps=3", f"trainer.max_tokens_per_pass={budget}",
                 "--output-dir", str(out), "--no-progress"])
    assert code == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["d1", "bgpo"])
def test_a_token_budget_leaves_the_quick_start_unchanged(tmp_path: Path, algorithm: str) -> None:
    whole = _metrics(tmp_path, algorithm, 0)
    budget = _metrics(tmp_path, algorithm, 32)
    assert len(whole) == len(budget) == 3
    for a, b in zip(whole, budget):
        assert a["reward_mean"] == b["reward_mean"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-8)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4, abs=1e-7)
        assert b["update_passes"] > a["update_passes"]  # the budget did split the passes

"""The Sudoku / Countdown algorithm comparison end to end on the shipped subsets (`--tiny`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from comparison_tasks import read_rows, solve_countdown, target_text, verify  # noqa: E402


def test_countdown_solver_expressions_pass_the_real_verifier() -> None:
    rows = read_rows(ROOT / "benchmarks" / "data" / "countdown-test-tiny.parquet")
    for row in rows:
        expr = target_text("countdown", row)
        assert expr is not None and verify(expr, row.key()) == (1.0, 1.0), (row, expr)
    assert solve_countdown([2, 3, 4], 5) == "2*4-3"  # the prompt's own example, shortest form
    assert solve_countdown([1, 1, 1], 100) is None


def test_sudoku_targets_pass_and_a_wrong_grid_fails() -> None:
    row = read_rows(ROOT / "benchmarks" / "data" / "sudoku-test-tiny.parquet")[0]
    assert verify(row.ground_truth, row.key()) == (1.0, 1.0)
    assert verify("1" * 16, row.key())[1] == 0.0


@pytest.mark.slow
def test_tiny_comparison_runs_every_task_and_family(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "algorithm_comparison.py"), "--tiny",
                    "--out", str(tmp_path)], check=True, cwd=ROOT, timeout=600)
    for task in ("sudoku", "countdown"):
        for family in ("llada", "sdar"):
            result = json.loads((tmp_path / f"{task}-{family}.json").read_text())
            assert set(result["runs"]) == {"cj-grpo", "control (cj-grpo, coin-flip reward)"}
            for seeds in result["runs"].values():
                assert len(seeds) == 2 and all(len(s["rewards"]) == 2 and 0 <= s["after"] <= 1 for s in seeds)
            assert (tmp_path / f"{task}-{family}.png").stat().st_size > 0

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


def test_variants_set_algorithm_optimizer_and_task_fields_through_their_classes() -> None:
    from algorithm_comparison import configure, parse_spec, split_specs

    assert split_specs("d1[prompt_mask_prob=0,optim.lr=1e-4],spg") == ["d1[prompt_mask_prob=0,optim.lr=1e-4]", "spg"]
    assert parse_spec("dmpo[baseline=group,num_iterations=1]") == ("dmpo", {"baseline": "group", "num_iterations": 1})
    alg, optim, fields = configure("d1[prompt_mask_prob=0,optim.lr=1e-4]", "llada", 2e-4)
    assert (alg.prompt_mask_prob, optim.lr, optim.grad_clip) == (0, 1e-4, 1.0)
    assert fields == {"prompt_mask_prob": 0, "optim.lr": 1e-4}
    alg, optim, fields = configure("espo[task=countdown]", "llada", 2e-4)  # DARE's countdown ESPO: beta 0.003, no clip
    assert (alg.kl_coef, alg.clip_low, alg.clip_high, alg.mc_num, optim.lr) == (0.003, 0.0, 0.0, 2, 2e-4)
    with pytest.raises(ValueError, match=r"\['promt_mask_prob'\] are not fields of algorithm d1"):
        configure("d1[promt_mask_prob=0]", "llada", 2e-4)
    with pytest.raises(ValueError, match="algorithm.mc_num must be even"):  # the class's own validation
        configure("dmpo[mc_num=3]", "llada", 2e-4)

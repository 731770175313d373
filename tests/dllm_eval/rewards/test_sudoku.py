"""Sudoku partial credit and strict rewards on real rows."""

from __future__ import annotations

import pytest

from dllm_eval import load_rows
from dllm_eval.rewards import score, sudoku_reward, sudoku_strict_reward


def test_real_rows() -> None:
    for row in load_rows("sudoku", limit=20):
        sol, puzzle = row.ground_truth, row.extra_info["puzzle"]
        assert score("sudoku", f"<answer>{sol}</answer>", sol, row.extra_info) == 1.0
        empty = [i for i, c in enumerate(puzzle) if c == "0"]
        wrong = list(sol)
        bad = "1" if sol[empty[0]] != "1" else "2"
        wrong[empty[0]] = bad
        r = sudoku_reward(f"<answer>{''.join(wrong)}</answer>", sol, puzzle)
        # one of len(empty) empty cells wrong -> (n-1)/n
        assert r.score == pytest.approx((len(empty) - 1) / len(empty)) and r.acc == 0.0
        assert sudoku_strict_reward(f"<answer>{''.join(wrong)}</answer>", sol, puzzle).score == 0.0
        assert score("sudoku", "no answer", sol, row.extra_info) == 0.0


def test_padding_and_truncation() -> None:
    sol, puzzle = "1234341221434321", "0000341221434321"
    assert sudoku_reward("<answer>12</answer>", sol, puzzle).score == 0.5  # '12' + '00'
    assert sudoku_reward("<answer>1 2 3 4 extra 99999999999999</answer>", sol, puzzle).score == 1.0
    assert sudoku_reward("<answer>\n1234\n3412\n2143\n4321\n</answer>", sol, puzzle).acc == 1.0

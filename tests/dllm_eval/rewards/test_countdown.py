"""Countdown reward: safe arithmetic parser and scoring on real rows."""

from __future__ import annotations

import json
from fractions import Fraction
from itertools import permutations, product

import pytest

from dllm_eval import load_rows
from dllm_eval.rewards import countdown_reward, evaluate_arithmetic, score


def test_parser_precedence_and_unary() -> None:
    assert evaluate_arithmetic("2*4-3") == 5
    assert evaluate_arithmetic("2+3*4") == 14
    assert evaluate_arithmetic("(2+3)*4") == 20
    assert evaluate_arithmetic("-(3-5)") == 2
    assert evaluate_arithmetic("7/2") == Fraction(7, 2)
    assert evaluate_arithmetic("10-2-3") == 5  # left-associative
    assert evaluate_arithmetic("8/2/2") == 2


@pytest.mark.parametrize("bad", ["2**3", "8//2", "__import__('os')", "1/0", "(1+2", "1 2", ""])
def test_parser_rejects(bad: str) -> None:
    with pytest.raises((ValueError, ZeroDivisionError)):
        evaluate_arithmetic(bad)


def _solve(nums: list[int], target: int) -> str | None:
    for a, b, c in permutations(nums):
        for o1, o2 in product("+-*/", repeat=2):
            for expr in (f"({a}{o1}{b}){o2}{c}", f"{a}{o1}({b}{o2}{c})"):
                try:
                    if evaluate_arithmetic(expr) == target:
                        return expr
                except ZeroDivisionError:
                    continue
    return None


def test_real_rows() -> None:
    solved = 0
    for row in load_rows("countdown", limit=30):
        nums = json.loads(row.extra_info["numbers"])
        target = int(row.ground_truth)
        expr = _solve(nums, target)
        if expr is None:
            continue
        solved += 1
        good = f"<reasoning>try</reasoning><answer>{expr}</answer>"
        assert score("countdown", good, row.ground_truth, row.extra_info) == 1.0
        wrong_value = f"<answer>{nums[0]}+{nums[1]}+{nums[2]}+0</answer>"
        assert score("countdown", wrong_value, row.ground_truth, row.extra_info) == 0.1
        assert score("countdown", "no tag", row.ground_truth, row.extra_info) == 0.0
    assert solved >= 10


def test_multiset_and_format_score() -> None:
    assert countdown_reward("<answer>2*4-3</answer>", "5", [2, 3, 4]).score == 1.0
    assert countdown_reward("<answer>2*4-3</answer>", "5", "[2, 3, 4]").acc == 1.0
    assert countdown_reward("<answer>4+1</answer>", "5", [2, 3, 4]).score == 0.1  # numbers
    assert countdown_reward("<answer>2*2*4-3</answer>", "5", [2, 3, 4]).score == 0.1  # reused
    assert countdown_reward("<answer>x</answer>", "5", [2, 3, 4], format_score=0.2).score == 0.2
    last = "<answer>1+1</answer> then <answer>2*4-3</answer>"
    assert countdown_reward(last, "5", [2, 3, 4]).score == 1.0

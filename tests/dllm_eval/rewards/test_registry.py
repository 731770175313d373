"""Reward router."""

from __future__ import annotations

import pytest

from dllm_eval import REWARDS, compute_reward, score


def test_unknown_source_lists_valid() -> None:
    with pytest.raises(ValueError, match="gsm8k"):
        score("nope", "x", "y")


def test_every_benchmark_source_registered() -> None:
    for name in ("gsm8k", "math", "math500", "aime2024", "aime2025", "countdown", "sudoku",
                 "humaneval", "humanevalplus", "mbpp"):
        assert name in REWARDS


def test_sudoku_prefix_and_missing_extra() -> None:
    extra = {"puzzle": "0000341221434321"}
    assert score("sudoku_4x4", "<answer>1234341221434321</answer>", "1234341221434321", extra) == 1.0
    with pytest.raises(ValueError, match="puzzle"):
        score("sudoku", "x", "1234341221434321")
    with pytest.raises(ValueError, match="numbers"):
        score("countdown", "x", "5")


def test_compute_reward_returns_typed_result() -> None:
    r = compute_reward("gsm8k", "\\boxed{18}", "18")
    assert (r.score, r.acc, r.pred) == (1.0, 1.0, "18")

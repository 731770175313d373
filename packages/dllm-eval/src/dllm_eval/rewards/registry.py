"""Reward router keyed by ``data_source``: one plain dict, one ``score`` function."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from dllm_eval.rewards.code import code_reward
from dllm_eval.rewards.countdown import countdown_reward
from dllm_eval.rewards.math import gsm8k_reward, math_reward
from dllm_eval.rewards.result import RewardResult
from dllm_eval.rewards.sudoku import sudoku_reward

__all__ = ["REWARDS", "RewardFn", "compute_reward", "score"]

RewardFn = Callable[[str, str, Mapping[str, Any]], RewardResult]
"""``(response, ground_truth, extra_info) -> RewardResult``."""


def _gsm8k(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return gsm8k_reward(response, gt, extraction=extra.get("gsm8k_extraction", "boxed"))


def _math(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return math_reward(response, gt)


def _countdown(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    if "numbers" not in extra:
        raise ValueError("countdown needs extra_info['numbers'] (JSON list of the given numbers)")
    return countdown_reward(response, gt, extra["numbers"],
                            format_score=float(extra.get("format_score", 0.1)))


def _sudoku(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    if "puzzle" not in extra:
        raise ValueError("sudoku needs extra_info['puzzle'] (the 16-char puzzle, '0' = empty)")
    return sudoku_reward(response, gt, str(extra["puzzle"]))


def _code(source: str) -> RewardFn:
    def fn(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
        return code_reward(source, response, gt, entry_point=extra.get("entry_point"))

    return fn


REWARDS: dict[str, RewardFn] = {
    "gsm8k": _gsm8k,
    "math": _math,
    "math500": _math,
    "aime2024": _math,
    "aime2025": _math,
    "countdown": _countdown,
    "sudoku": _sudoku,
    "humaneval": _code("humaneval"),
    "humanevalplus": _code("humanevalplus"),
    "mbpp": _code("mbpp"),
}
"""Reward function per ``data_source``. Register a new source by adding an entry."""


def compute_reward(
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
) -> RewardResult:
    """Full typed result (score, acc, pred) for one response; see :func:`score`."""
    fn = REWARDS.get(data_source)
    if fn is None and data_source.startswith("sudoku"):
        fn = REWARDS["sudoku"]
    if fn is None:
        raise ValueError(
            f"unknown data_source {data_source!r}; valid: {sorted(REWARDS)} "
            "(add an entry to dllm_eval.REWARDS to register a new one)"
        )
    return fn(response, ground_truth, extra_info or {})


def score(
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
) -> float:
    """Scalar RL reward for one response, routed on ``data_source`` (see :data:`REWARDS`)."""
    return compute_reward(data_source, response, ground_truth, extra_info).score

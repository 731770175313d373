"""Reward router keyed by reward mode and ``data_source``: plain dicts, one ``score`` function.

Modes: ``default`` (our verified rules, the RL reward), ``dare`` (DARE's verl rules, for numbers
comparable with DARE's), ``d1`` (d1's evaluation parsers, for numbers comparable with d1's).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from dllm_eval.rewards.code import CODE_SOURCES, code_reward
from dllm_eval.rewards.countdown import countdown_reward
from dllm_eval.rewards.d1 import (
    d1_countdown_reward,
    d1_gsm8k_reward,
    d1_math_reward,
    d1_sudoku_reward,
)
from dllm_eval.rewards.dare import dare_countdown_reward, dare_math_reward, dare_sudoku_reward
from dllm_eval.rewards.math import gsm8k_reward, math_reward
from dllm_eval.rewards.result import RewardResult
from dllm_eval.rewards.sudoku import sudoku_reward

__all__ = ["REWARDS", "REWARD_MODES", "RewardFn", "compute_reward", "score"]

RewardFn = Callable[[str, str, Mapping[str, Any]], RewardResult]
"""``(response, ground_truth, extra_info) -> RewardResult``."""


def _gsm8k(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return gsm8k_reward(response, gt, extraction=extra.get("gsm8k_extraction", "boxed"))


def _math(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return math_reward(response, gt)


def _numbers(extra: Mapping[str, Any]) -> Any:
    if "numbers" not in extra:
        raise ValueError("countdown needs extra_info['numbers'] (JSON list of the given numbers)")
    return extra["numbers"]


def _puzzle(extra: Mapping[str, Any]) -> str:
    if "puzzle" not in extra:
        raise ValueError("sudoku needs extra_info['puzzle'] (the 16-char puzzle, '0' = empty)")
    return str(extra["puzzle"])


def _countdown(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return countdown_reward(response, gt, _numbers(extra),
                            format_score=float(extra.get("format_score", 0.1)))


def _sudoku(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return sudoku_reward(response, gt, _puzzle(extra))


def _dare_math(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return dare_math_reward(response, gt)


def _dare_countdown(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return dare_countdown_reward(response, gt, _numbers(extra))


def _dare_sudoku(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return dare_sudoku_reward(response, gt, _puzzle(extra))


def _d1_gsm8k(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return d1_gsm8k_reward(response, gt)


def _d1_math(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return d1_math_reward(response, gt)


def _d1_countdown(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return d1_countdown_reward(response, gt, _numbers(extra))


def _d1_sudoku(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
    return d1_sudoku_reward(response, gt, _puzzle(extra))


def _fn_name(extra: Mapping[str, Any]) -> str | None:
    """``extra_info['fn_name']``, else DARE's ``extra_info['metadata']['func_name']``."""
    if extra.get("fn_name"):
        return str(extra["fn_name"])
    meta = extra.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
    name = meta.get("func_name") if isinstance(meta, dict) else None
    return str(name) if name else None


def _code(source: str) -> RewardFn:
    def fn(response: str, gt: str, extra: Mapping[str, Any]) -> RewardResult:
        return code_reward(source, response, gt, entry_point=extra.get("entry_point"),
                           fn_name=_fn_name(extra))

    return fn


_CODE: dict[str, RewardFn] = {source: _code(source) for source in CODE_SOURCES}

REWARDS: dict[str, RewardFn] = {
    "gsm8k": _gsm8k,
    "math": _math,
    "math500": _math,
    "aime2024": _math,
    "aime2025": _math,
    "countdown": _countdown,
    "sudoku": _sudoku,
    **_CODE,
}
"""Reward function per ``data_source`` (default mode). Register a new source by adding an entry."""

REWARD_MODES: dict[str, dict[str, RewardFn]] = {
    "default": REWARDS,
    "dare": {
        **{src: _dare_math for src in ("gsm8k", "math", "math500", "aime2024", "aime2025")},
        "countdown": _dare_countdown,
        "sudoku": _dare_sudoku,
        **_CODE,
    },
    "d1": {
        "gsm8k": _d1_gsm8k,
        **{src: _d1_math for src in ("math", "math500", "aime2024", "aime2025")},
        "countdown": _d1_countdown,
        "sudoku": _d1_sudoku,
        **_CODE,
    },
}
"""Reward tables by mode: ``default`` (ours), ``dare`` (DARE's verl rules), ``d1`` (d1's parsers).
Code sources score the same in every mode (sandboxed tests; DARE's extraction rules)."""


def compute_reward(
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    *,
    mode: str = "default",
) -> RewardResult:
    """Full typed result (score, acc, pred, weight) for one response; see :func:`score`."""
    table = REWARD_MODES.get(mode)
    if table is None:
        raise ValueError(f"unknown reward mode {mode!r}; valid: {sorted(REWARD_MODES)}")
    fn = table.get(data_source)
    if fn is None and data_source.startswith("sudoku"):
        fn = table["sudoku"]
    if fn is None:
        raise ValueError(
            f"unknown data_source {data_source!r} for reward mode {mode!r}; valid: "
            f"{sorted(table)} (add an entry to dllm_eval.REWARD_MODES[{mode!r}] to register one)"
        )
    return fn(response, ground_truth, extra_info or {})


def score(
    data_source: str,
    response: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    *,
    mode: str = "default",
) -> float:
    """Scalar RL reward for one response, routed on ``mode`` and ``data_source``.

    See :data:`REWARD_MODES`; the default mode is :data:`REWARDS`.
    """
    return compute_reward(data_source, response, ground_truth, extra_info, mode=mode).score

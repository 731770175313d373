"""The typed result every reward function returns."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RewardResult"]


@dataclass(frozen=True, kw_only=True)
class RewardResult:
    """Scalar reward plus what was logged next to it in the reference reward manager.

    Args:
        score: the RL reward (e.g. 1.0 correct, 0.1 countdown format score, 0.0 wrong).
        acc: whether the answer is fully correct (1.0 / 0.0); for partial-credit rewards
            this is strict correctness, not the partial score.
        pred: the extracted answer (None when extraction failed).
        weight: the sample's weight in a benchmark average (1 except where a protocol
            averages over smaller units, e.g. d1's Sudoku: the number of empty cells).
    """

    score: float
    acc: float
    pred: str | None
    weight: float = 1.0

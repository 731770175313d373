"""4x4 Sudoku reward: partial credit over the puzzle's empty cells, and a strict variant.

Rule (DARE): digits of the last ``<answer>`` block, right-padded with '0' or truncated to the
board size (16); score = fraction of the puzzle's empty cells ('0') whose digit equals the
solution. No answer tag -> 0. ``acc`` is 1.0 only when every empty cell is right.
"""

from __future__ import annotations

from dllm_eval.rewards.countdown import extract_answer_tag
from dllm_eval.rewards.result import RewardResult

__all__ = ["sudoku_reward", "sudoku_strict_reward"]


def sudoku_reward(response: str, solution: str, puzzle: str) -> RewardResult:
    """Partial-credit Sudoku reward (fraction of empty cells filled correctly)."""
    if len(solution) != len(puzzle):
        raise ValueError(
            f"solution ({len(solution)} chars) and puzzle ({len(puzzle)} chars) must match"
        )
    answer = extract_answer_tag(response)
    if answer is None:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    digits = "".join(ch for ch in answer if ch.isdigit())
    digits = digits[: len(solution)].ljust(len(solution), "0")
    empty = [i for i, ch in enumerate(puzzle) if ch == "0"]
    if not empty:
        return RewardResult(score=1.0, acc=1.0, pred=digits)
    right = sum(digits[i] == solution[i] for i in empty)
    return RewardResult(score=right / len(empty), acc=float(right == len(empty)), pred=digits)


def sudoku_strict_reward(response: str, solution: str, puzzle: str) -> RewardResult:
    """All-or-nothing Sudoku reward: 1.0 only if every empty cell is right."""
    partial = sudoku_reward(response, solution, puzzle)
    return RewardResult(score=partial.acc, acc=partial.acc, pred=partial.pred)

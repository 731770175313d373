"""Score d1's published generation files with a preset's rewards (the d1 reproduction check).

d1 (dllm-reasoning/d1, ``eval/eval_baselines/``) publishes, per task, generation length and GPU
rank, a JSON file ``<task>_<model>_<gen_length>_<steps>_<rank>_generations.json`` with
``generations: [{question, generations, ground_truth}, ...]``; d1's
``eval/parse_and_get_acc.py`` turns them into the paper's accuracies. :func:`score_d1_file`
scores one such file with our rewards, so a file's count can be compared with d1's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dllm_eval.presets import get_preset
from dllm_eval.rewards import compute_reward

__all__ = ["D1_FILE_TASKS", "D1FileScore", "d1_file_setup", "score_d1_file"]

D1_FILE_TASKS: dict[str, str] = {"gsm8k": "gsm8k", "math": "math500", "math500": "math500",
                                 "countdown": "countdown", "sudoku": "sudoku"}
"""File-name task prefix -> our ``data_source``."""

_NAME = re.compile(r"^(?P<task>[a-z0-9]+)_(?P<model>.+)_(?P<length>\d+)_(?P<steps>\d+)_"
                   r"(?P<rank>\d+)_generations\.json$")
_PUZZLE = re.compile(r"Sudoku puzzle: ([0-9]{16})")


@dataclass(frozen=True, kw_only=True)
class D1FileScore:
    """Our score of one d1 file: ``correct`` of ``total`` (Sudoku: right cells of empty cells)."""

    name: str
    data_source: str
    gen_length: int
    correct: float
    total: float
    per_item: tuple[float, ...]

    @property
    def accuracy(self) -> float:
        """``correct / total`` in percent."""
        return 100.0 * self.correct / self.total if self.total else 0.0


def d1_file_setup(name: str) -> tuple[str, int]:
    """``(data_source, gen_length)`` of a d1 generation file name.

    Raises:
        ValueError: for a name that is not ``<task>_<model>_<len>_<steps>_<rank>_generations.json``.
    """
    match = _NAME.match(name)
    if match is None or match["task"] not in D1_FILE_TASKS:
        raise ValueError(f"{name!r} is not a d1 generation file name "
                         "(<task>_<model>_<gen_length>_<steps>_<rank>_generations.json, task one "
                         f"of {sorted(D1_FILE_TASKS)})")
    return D1_FILE_TASKS[match["task"]], int(match["length"])


def _inputs(source: str, item: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Ground truth and extra_info of one d1 item in our reward schema."""
    gt: Any = item.get("ground_truth")
    if source == "countdown":
        numbers, target = gt
        return str(target), {"numbers": json.dumps([int(n) for n in numbers])}
    if source == "sudoku":
        question = str(item.get("question", ""))
        head = question[:16]
        match = _PUZZLE.search(question)
        puzzle = head if len(head) == 16 and head.isdigit() else (match.group(1) if match else "")
        if len(puzzle) != 16:
            raise ValueError(f"no 16-digit puzzle in sudoku question {question[:80]!r}")
        return str(gt), {"puzzle": puzzle}
    return ("None" if gt is None else str(gt)), {}


def score_d1_file(name: str, data: Mapping[str, Any], *, preset: str = "d1") -> D1FileScore:
    """Score the generations of one d1 file with ``preset``'s reward mode.

    Args:
        name: the file name (gives the task and generation length).
        data: the file's parsed JSON (its ``generations`` list is read).
        preset: the preset whose ``reward_mode`` scores (``d1`` reproduces d1's parser).

    Returns:
        Per-item ``acc x weight`` (d1: 1/0 per question; Sudoku: right cells) and the totals.
    """
    source, length = d1_file_setup(name)
    mode = get_preset(preset).reward_mode
    per_item: list[float] = []
    total = 0.0
    for item in data.get("generations", []):
        gt, extra = _inputs(source, item)
        result = compute_reward(source, str(item.get("generations", "")), gt, extra, mode=mode)
        per_item.append(result.acc * result.weight)
        total += result.weight
    return D1FileScore(name=name, data_source=source, gen_length=length, correct=sum(per_item),
                       total=total, per_item=tuple(per_item))

"""Sudoku and Countdown in a compact character vocabulary, scored by dllm_eval's real verifiers.

The puzzles, numbers, targets and solutions come from DARE's RL parquet rows
(`data_source`, `reward_model.ground_truth`, `extra_info.puzzle` / `extra_info.numbers`). A prompt
is 16 characters and a response at most 16:

- Sudoku: prompt = the puzzle (`0` = empty), response = the 16-digit solution.
- Countdown: prompt = `aaa,bbb,ccc=ttt=` (numbers and target zero-padded to 3 digits), response =
  an expression such as `(44-19)*35` followed by EOS. SFT targets come from `solve_countdown`, an
  exhaustive search over the three numbers.

Scoring wraps the decoded response in `<answer>...</answer>` (the tag the verifiers extract) and
calls `dllm_eval.compute_reward(data_source, text, ground_truth, extra_info)`: Sudoku's partial
credit (fraction of empty cells right) is the RL reward and its `acc` (every empty cell right) the
accuracy; Countdown's reward is 1 / 0.1 (parseable but wrong) / 0, its `acc` 1 when the expression
uses exactly the given numbers and hits the target.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from dllm_eval import compute_reward, evaluate_arithmetic
from dllm_models import char_tokenizer

ALPHABET = "0123456789+-*/(),="
PROMPT_LEN = 16
RESPONSE_LEN = 16
TASKS = ("sudoku", "countdown")
SPLITS = {"sudoku": ("train/sudoku-n20000_1.parquet", "test/sudoku_1.parquet"),
          "countdown": ("train/countdown-n20000_1.parquet", "test/countdown_1.parquet")}


def build_tokenizer() -> Any:
    """The shared character tokenizer: digits, `+-*/(),=`, EOS (= pad), mask (20 ids)."""
    return char_tokenizer(ALPHABET)


@dataclass(frozen=True)
class Row:
    """One parquet row, reduced to what the tasks use."""

    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]

    def key(self) -> str:
        """The row as the RL `answer` string (the reward worker passes it back to `reward`)."""
        return json.dumps([self.data_source, self.ground_truth, self.extra_info])


def read_rows(path: Path) -> list[Row]:
    """The rows of a DARE RL parquet (`data_source`, `reward_model`, `extra_info`)."""
    import pyarrow.parquet as pq

    out = []
    for r in pq.read_table(path, columns=["data_source", "reward_model", "extra_info"]).to_pylist():
        extra = {k: v for k, v in r["extra_info"].items() if k in ("puzzle", "numbers") and v is not None}
        out.append(Row(r["data_source"], str(r["reward_model"]["ground_truth"]), extra))
    return out


def usable(task: str, row: Row) -> bool:
    """Rows the compact format holds: three numbers <= 999 and a target <= 999 (Countdown)."""
    if task == "sudoku":
        return len(row.extra_info.get("puzzle", "")) == 16
    nums = json.loads(row.extra_info["numbers"])
    return len(nums) == 3 and max(nums) <= 999 and 0 <= int(row.ground_truth) <= 999


def prompt_text(task: str, row: Row) -> str:
    """The 16-character prompt of a row."""
    if task == "sudoku":
        return str(row.extra_info["puzzle"])
    a, b, c = json.loads(row.extra_info["numbers"])
    return f"{a:03d},{b:03d},{c:03d}={int(row.ground_truth):03d}="


def solve_countdown(numbers: list[int], target: int) -> str | None:
    """The shortest expression using each of the three numbers once that equals `target`.

    Exhaustive: every order of the numbers, every pair of operators from `+-*/`, and both
    bracketings ((x o y) o z, x o (y o z)), each also tried without brackets; candidates are
    checked with dllm_eval's exact evaluator. Ties go to the first found (orders and operators in
    their listed order), so the result is deterministic. None when no expression hits the target.
    """
    best: str | None = None
    for x, y, z in itertools.permutations(numbers):
        for o1, o2 in itertools.product("+-*/", repeat=2):
            for expr in (f"{x}{o1}{y}{o2}{z}", f"({x}{o1}{y}){o2}{z}", f"{x}{o1}({y}{o2}{z})"):
                if best is not None and len(expr) >= len(best):
                    continue
                try:
                    ok = evaluate_arithmetic(expr) == Fraction(target)
                except ValueError:
                    ok = False
                if ok:
                    best = expr
    return best


def target_text(task: str, row: Row) -> str | None:
    """The SFT response of a row (None: Countdown without a solution, or one too long)."""
    if task == "sudoku":
        return row.ground_truth
    expr = solve_countdown(json.loads(row.extra_info["numbers"]), int(row.ground_truth))
    return expr if expr is not None and len(expr) <= RESPONSE_LEN else None


def verify(text: str, key: str) -> tuple[float, float]:
    """(reward, acc) of decoded response `text` against the row packed in `key`, by dllm_eval."""
    source, truth, extra = json.loads(key)
    result = compute_reward(source, f"<answer>{text}</answer>", truth, extra)
    return result.score, result.acc


def reward(text: str, key: str) -> float:
    """The RL reward (dllm_eval's score: Sudoku partial credit, Countdown 1 / 0.1 / 0)."""
    return verify(text, key)[0]


class TaskData:
    """Encoded prompts, SFT batches and RL prompt batches of one task.

    Args:
        task: "sudoku" or "countdown".
        train, test: parquet rows of the two splits.
        tokenizer: `build_tokenizer()`.
        num_val: training rows held out to choose the SFT stopping point (never trained on).
        num_test: test rows evaluated (0: all).
    """

    def __init__(self, task: str, train: list[Row], test: list[Row], tokenizer: Any, *,
                 num_val: int, num_test: int = 0) -> None:
        if task not in TASKS:
            raise ValueError(f"task {task!r} is unknown; choose one of {TASKS}")
        self.task = task
        self.tok = tokenizer
        self.eos = tokenizer.eos_token_id
        rows = [r for r in train if usable(task, r)]
        self.val = rows[:num_val]
        pairs = [(r, target_text(task, r)) for r in rows[num_val:]]
        self.sft_rows = [(r, t) for r, t in pairs if t is not None]
        self.rl_rows = [r for r, _ in pairs]
        tests = [r for r in test if usable(task, r)]
        self.test = tests[:num_test] if num_test else tests
        self.skipped_test = len(test) - len([r for r in test if usable(task, r)])

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, row: Row) -> list[int]:
        ids = self.encode(prompt_text(self.task, row))
        assert len(ids) == PROMPT_LEN, (self.task, prompt_text(self.task, row))
        return ids

    def detokenize(self, ids: list[int]) -> str:
        """A response's text, cut at the first EOS."""
        cut = ids.index(self.eos) if self.eos in ids else len(ids)
        return str(self.tok.decode(ids[:cut]))

    def sft_batch(self, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, response_mask), each [count, 32]: prompt + target + EOS fill."""
        rng = random.Random(seed)
        rows = [self.sft_rows[rng.randrange(len(self.sft_rows))] for _ in range(count)]
        ids = []
        for row, target in rows:
            answer = self.encode(target)
            ids.append(self.prompt_ids(row) + answer + [self.eos] * (RESPONSE_LEN - len(answer)))
        ids_t = torch.tensor(ids, dtype=torch.long)
        response = torch.zeros_like(ids_t, dtype=torch.bool)
        response[:, PROMPT_LEN:] = True
        return ids_t, torch.ones_like(ids_t, dtype=torch.bool), response

    def rl_prompts(self, count: int, seed: int) -> tuple[list[list[int]], list[str]]:
        """`count` training prompts (seeded draw) and their answer keys for `reward`."""
        rng = random.Random(seed)
        rows = [self.rl_rows[rng.randrange(len(self.rl_rows))] for _ in range(count)]
        return [self.prompt_ids(r) for r in rows], [r.key() for r in rows]


__all__ = ["ALPHABET", "PROMPT_LEN", "RESPONSE_LEN", "SPLITS", "TASKS", "Row", "TaskData", "build_tokenizer",
           "prompt_text", "read_rows", "reward", "solve_countdown", "target_text", "verify"]

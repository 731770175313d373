"""d1's answer parsers, rule for rule (the ``d1`` reward mode).

Follows ``eval/parse_and_get_acc.py`` and ``eval/parser_helper.py`` of dllm-reasoning/d1
(commit 837888f), which turn the saved generations into the accuracies of the d1 paper
(Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via Reinforcement
Learning", 2025). The responses these rules see are d1's raw decodes: ``gen_length`` tokens
decoded with ``skip_special_tokens=False`` (so ``<|eot_id|>`` and padding are in the text);
the ``d1`` presets decode the same way.

- GSM8K: the first ``\\boxed{...}`` (non-greedy, up to the first ``}``) whose content is a float
  or contains a number (its first number); else the first ``<answer>`` block, as a float or its
  last number. Correct iff that float equals the ground truth exactly.
- MATH-500: the last ``\\boxed`` (d1's ``last_boxed_only_string``: the ``"\\boxed "`` space form
  wins anywhere in the text; no box -> the whole text); empty -> the first ``<answer>`` block;
  equal iff the Hendrycks-normalised strings match (raw equality when normalising raises).
- Countdown: the last ``\\boxed`` as above (unbalanced -> the first ``<answer>`` block, else the
  whole text); ``\\div``, ``\\times``, ``\\cdot`` -> ``/ * *``; the left side of the first
  ``expr = number``; the integers in it must be the given numbers; evaluated with Python's
  arithmetic semantics (``eval`` in d1; an AST walk over numbers and ``+ - * / // % **`` here).
- Sudoku: the first of five regexes that yields a non-empty string (``<answer>`` with a code
  fence; ``<answer>`` up to ``<|eot_id|>``/``<|endoftext|>``/``</answer>``; text after
  ``</answer>``; 16 digits before ``</answer>``; any 16-digit word), whitespace removed, padded
  with 0 or cut to 16; score = right empty cells / empty cells, and the result's ``weight`` is
  the number of empty cells, because d1 reports correct cells over empty cells of the whole set.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Callable, Sequence

from dllm_eval.rewards.hendrycks import NormalisationError, hendrycks_normalize, last_boxed_span
from dllm_eval.rewards.result import RewardResult

__all__ = [
    "d1_countdown_reward",
    "d1_extract_boxed",
    "d1_gsm8k_reward",
    "d1_is_equiv",
    "d1_math_reward",
    "d1_sudoku_reward",
    "python_arithmetic",
]

_FIRST_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM_BOXES = re.compile(r"\\boxed\{(.*?)\}")
_GSM_NUMBER = re.compile(r"-?\d+\.?\d*")
_ONLY_DOTS = re.compile(r"^\.+$")
_CD_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_CD_EQUATION = re.compile(r"([0-9+\-*/() ]+)=[0-9. ]+")
_SUDOKU_PATTERNS = tuple(re.compile(p, re.DOTALL) for p in (
    r"<answer>.*?```\s*([\d\s]+)```",
    r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
    r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
    r".*?(\d{16})\s*</answer>",
    r"\b(\d{16})\b",
))
_MAX_EXPONENT = 64


def _first_answer_block(text: str) -> str | None:
    match = _FIRST_ANSWER.search(text)
    return match.group(1).strip() if match else None


def d1_extract_boxed(text: str) -> str | None:
    """d1's ``remove_boxed(last_boxed_only_string(text))``; None where d1's call raises.

    ``"\\boxed "`` anywhere -> the text after its last occurrence, up to a ``$``; otherwise the
    last ``\\boxed{...}``/``\\fbox{...}`` span, unwrapped when it is a ``\\boxed{...}``; no
    command at all -> the whole text; an unclosed brace -> None.
    """
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    if text.rfind("\\boxed") < 0 and text.rfind("\\fbox") < 0:
        return text
    span = last_boxed_span(text)
    if span is None:
        return None
    if span.startswith("\\boxed{") and span.endswith("}"):
        return span[len("\\boxed{"):-1]
    return span


def d1_is_equiv(pred: str, gold: str) -> bool:
    """d1's ``is_equiv`` for strings: normalised equality, raw equality if normalising raises."""
    try:
        return hendrycks_normalize(pred, strict_ints=True) == hendrycks_normalize(
            gold, strict_ints=True)
    except NormalisationError:
        return pred == gold


def _gsm8k_number(text: str, *, first: bool) -> float | None:
    try:
        return float(text)
    except ValueError:
        numbers = _GSM_NUMBER.findall(text)
        return float(numbers[0] if first else numbers[-1]) if numbers else None


def d1_gsm8k_reward(response: str, ground_truth: str | float | None) -> RewardResult:
    """GSM8K under d1's parser (see module docstring); the ground truth is a number.

    ``None`` (or text that is not a number) as ground truth is never matched, as in d1: d1's
    files hold ``None`` where d1's ``####`` regex, which has no minus sign, found no answer.
    """
    parsed: float | None = None
    for content in _GSM_BOXES.findall(response):
        content = content.strip()
        if not content or content == "..." or _ONLY_DOTS.match(content):
            continue
        parsed = _gsm8k_number(content, first=True)
        if parsed is not None:
            break
    if parsed is None:
        block = _first_answer_block(response)
        if block:
            parsed = _gsm8k_number(block, first=False)
    try:
        gold = None if ground_truth is None else float(str(ground_truth).replace(",", ""))
    except ValueError:
        gold = None
    ok = parsed is not None and gold is not None and parsed == gold
    return RewardResult(score=float(ok), acc=float(ok),
                        pred=None if parsed is None else repr(parsed))


def d1_math_reward(response: str, ground_truth: str) -> RewardResult:
    """MATH-500 under d1's parser (see module docstring)."""
    parsed = d1_extract_boxed(response)
    if not parsed:
        block = _first_answer_block(response)
        if block is not None:
            parsed = block
    ok = parsed is not None and d1_is_equiv(parsed, ground_truth)
    return RewardResult(score=float(ok), acc=float(ok), pred=parsed)


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _walk(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax {type(node).__name__}")


def python_arithmetic(expr: str) -> Any:
    """Value of ``expr`` as Python's ``eval`` would compute it, or ``inf`` where eval fails.

    Only numbers, ``+ - * / // % **``, unary signs and parentheses are evaluated (an AST walk,
    not ``eval``); the characters must match ``^[\\d+\\-*/().\\s]+$`` as in d1. Deliberate
    difference from ``eval``: an exponent above 64 in magnitude is refused (``inf``) instead of
    computing a huge power.
    """
    if not _CD_CHARS.match(expr):
        return float("inf")
    try:
        return _walk(ast.parse(expr.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError,
            RecursionError, MemoryError):
        return float("inf")


def d1_countdown_reward(response: str, target: int | float | str,
                        numbers: Sequence[int] | str) -> RewardResult:
    """Countdown under d1's parser (see module docstring); no format credit."""
    nums = json.loads(numbers) if isinstance(numbers, str) else list(numbers)
    equation = d1_extract_boxed(response)
    if equation is None:
        block = _first_answer_block(response)
        equation = block if block is not None else response
    equation = equation.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    match = _CD_EQUATION.search(equation)
    if match:
        equation = match.group(1).strip()
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    ok = False
    if used == sorted(int(n) for n in nums):
        value = python_arithmetic(equation)
        try:
            ok = bool(abs(value - float(target)) < 1e-5)
        except (TypeError, OverflowError):
            ok = False
    return RewardResult(score=float(ok), acc=float(ok), pred=equation)


def d1_sudoku_reward(response: str, solution: str, puzzle: str) -> RewardResult:
    """Sudoku under d1's parser: cell accuracy, weighted by the number of empty cells."""
    if len(puzzle) != 16 or len(solution) != 16:
        raise ValueError(
            f"d1 sudoku needs 16-character puzzle and solution, got {len(puzzle)} and "
            f"{len(solution)}; d1 evaluates 4x4 boards only")
    found = ""
    for pattern in _SUDOKU_PATTERNS:
        match = pattern.search(response)
        if match and match.group(1).strip():
            found = match.group(1).strip()
            break
    digits = re.sub(r"\s", "", found)
    empty = [i for i, ch in enumerate(puzzle) if ch == "0"]
    right = 0
    if digits:
        digits = digits[:16].ljust(16, "0")
        right = sum(digits[i] == solution[i] for i in empty)
    frac = right / len(empty) if empty else 0.0
    return RewardResult(score=frac, acc=frac, pred=digits or None, weight=float(len(empty)))

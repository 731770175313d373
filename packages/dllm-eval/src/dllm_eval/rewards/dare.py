"""DARE's verl reward rules (the ``dare`` reward mode), so numbers compare with DARE's.

Follows ``verl/utils/reward_score/math_reward.py`` (``math_rm``) of yjyddq/DARE (commit 83ae8a3),
the reward of ``scripts/eval_local_bench.sh`` (``dllm_rm``) for GSM8K, MATH, Countdown and Sudoku:

- Math (GSM8K, MATH, AIME): the last ``\\boxed{...}`` (none -> 0). Correct if the Hendrycks
  forms match (``mathd``), or under the "DeepScaleR" sympy grader: answers normalised (units
  from a fixed list removed, ``million`` -> ``*10^6``, ``\\text{}`` unwrapped, lower case, ...),
  split into tuple elements, and per element: two fractions ``a/b`` must match **as written**
  (unreduced fractions are wrong), an integer ground truth needs an integer answer (so
  ``\\frac{4250}{2}`` is wrong for 2125), otherwise ``sympy.simplify(gt - pred) == 0``.
- Countdown: the last ``<answer>``; numbers must be the given multiset, Python arithmetic; right
  -> 1.0, extracted but wrong -> 0.1, none -> 0. ``acc`` equals the score, as DARE logs it.
- Sudoku: digits of the last ``<answer>``, padded/cut to 16; score = fraction of empty cells
  right (a puzzle without empty cells scores 0); ``acc`` equals the score.

Known difference: DARE renders LaTeX to text with ``pylatexenc`` before sympy; we convert the
handful of commands MATH answers use (``\\frac``, ``\\sqrt``, ``\\pi``, ``\\infty``, ``\\cdot``,
``\\times``, ``\\cup``) ourselves, so exotic LaTeX can parse differently.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from dllm_eval.rewards.d1 import python_arithmetic
from dllm_eval.rewards.hendrycks import NormalisationError, hendrycks_normalize, last_boxed_span
from dllm_eval.rewards.result import RewardResult

__all__ = [
    "DARE_UNITS",
    "dare_countdown_reward",
    "dare_extract_boxed",
    "dare_grade",
    "dare_math_reward",
    "dare_sudoku_reward",
]

DARE_UNITS: tuple[str, ...] = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
    "month", "year", "foot", "feet", "inch", "yard",
)
"""Unit words DARE's grader deletes (with plural ``s``/``es`` and a ``^n`` power)."""

_TEXT_WRAP = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_FRAC = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_COMMA_GROUP = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LATEX_WORDS = (("\\pi", "pi"), ("\\infty", "inf"), ("\\cup", "U"), ("\\cdot", "*"),
                ("\\times", "*"))


def dare_extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``; None without one (``\\fbox`` spans count as none)."""
    if "\\boxed" not in text:
        return None
    span = last_boxed_span(text)
    if span is None or not (span.startswith("\\boxed{") and span.endswith("}")):
        return None
    return span[len("\\boxed{"):-1]


def _mathd(answer: str) -> str:
    answer = answer.strip()
    match = _TEXT_WRAP.search(answer)
    if match is not None:
        answer = match.group("text").strip()
    try:
        return hendrycks_normalize(answer)
    except NormalisationError:
        return answer


def _braced(s: str, start: int) -> tuple[str, int] | None:
    """The group ``{...}`` opening at ``s[start]`` and the index after it."""
    if start >= len(s) or s[start] != "{":
        return None
    depth = 0
    for i in range(start, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return s[start + 1:i], i + 1
    return None


def _atom(text: str) -> str:
    return text if re.fullmatch(r"\w+", text) else f"({text})"


def _latex_to_text(expr: str) -> str:
    """LaTeX answer -> sympy-readable text (``\\frac{a}{b}`` -> `` a/b``, parenthesised unless a
    single word, so ``3\\frac{1}{2}`` reads as the mixed number ``3 1/2``; ``\\sqrt{x}`` ->
    ``sqrt(x)``; a few symbols); other commands lose their backslash."""
    out, i = "", 0
    while i < len(expr):
        if expr.startswith("\\frac", i):
            num = _braced(expr, i + 5)
            den = _braced(expr, num[1]) if num else None
            if num and den:
                out += f" {_atom(_latex_to_text(num[0]))}/{_atom(_latex_to_text(den[0]))}"
                i = den[1]
                continue
        if expr.startswith("\\sqrt", i):
            arg = _braced(expr, i + 5)
            if arg:
                out += f"sqrt({_latex_to_text(arg[0])})"
                i = arg[1]
                continue
        out += expr[i]
        i += 1
    for old, new in _LATEX_WORDS:
        out = out.replace(old, new)
    return re.sub(r"\\([A-Za-z]+)", r"\1", out).replace("\\", "").strip()


def _is_int_value(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _strip_commas(expr: str) -> str:
    while True:
        nxt = _COMMA_GROUP.sub(r"\1\3\4", expr)
        if nxt == expr:
            return nxt
        expr = nxt


def _str_is_int(x: str) -> bool:
    try:
        return _is_int_value(float(_strip_commas(x)))
    except ValueError:
        return False


def _normalize(expr: str) -> str:
    """DARE's ``_normalize`` (DeepScaleR grader)."""
    match = _TEXT_WRAP.search(expr)
    if match is not None:
        expr = match.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "),
                     (" and ", " , "), ("million", "*10^6"), ("billion", "*10^9"),
                     ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    for unit in DARE_UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    try:
        if _is_int_value(float(expr)):
            expr = str(int(round(float(expr))))
    except ValueError:
        pass
    if "\\" in expr:
        expr = _latex_to_text(expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac"))
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _sympy_equal(gt: str, pred: str) -> bool:
    expr = f"({gt})-({pred})"
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if (len(letters) > 2 or "^{" in expr or "^(" in expr
            or any(r.search(expr) for r in _BAD_REGEXES)):
        return False
    try:
        import sympy  # type: ignore[import-untyped,unused-ignore]
        from sympy.parsing import sympy_parser  # type: ignore[import-untyped,unused-ignore]

        parsed = sympy_parser.parse_expr(
            expr.replace("^", "**"),
            transformations=(sympy_parser.standard_transformations
                             + (sympy_parser.implicit_multiplication_application,)))
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # sympy raises many error types on odd input; DARE treats all as "not equal"
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_commas(expr)
    if not expr:
        return []
    if (len(expr) > 2 and expr[0] in "()[]" and expr[-1] in "()[]"
            and all(ch not in expr[1:-1] for ch in "()[]")):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def _grade_sympy(pred: str, gold: str) -> bool:
    gt_n, pred_n = _normalize(gold), _normalize(pred)
    if gt_n == pred_n:
        return True
    if not pred_n:
        return False
    gt_elems, pred_elems = _split_tuple(gt_n), _split_tuple(pred_n)
    if len(gt_elems) > 1 and (gt_n[0] != pred_n[0] or gt_n[-1] != pred_n[-1]):
        return False
    if len(gt_elems) != len(pred_elems):
        return False
    for g, p in zip(gt_elems, pred_elems):
        if _FRAC.search(g) and _FRAC.search(p):
            ok = g == p
        elif _str_is_int(g) != _str_is_int(p):
            ok = False
        else:
            ok = _sympy_equal(g, p)
        if not ok:
            return False
    return True


def dare_grade(pred: str, gold: str) -> bool:
    """DARE's verdict on an extracted answer: Hendrycks equality or the sympy grader."""
    return _mathd(pred) == _mathd(gold) or _grade_sympy(pred, gold)


def dare_math_reward(response: str, ground_truth: str) -> RewardResult:
    """GSM8K / MATH / AIME under DARE's ``math_rm`` (see module docstring)."""
    pred = dare_extract_boxed(response)
    gold: str | None = str(ground_truth)
    if gold is not None and "\\boxed" in gold:
        gold = dare_extract_boxed(gold)
    ok = pred is not None and bool(gold) and dare_grade(pred, str(gold))
    return RewardResult(score=float(ok), acc=float(ok), pred=pred)


def dare_countdown_reward(response: str, target: str | int, numbers: Sequence[int] | str,
                          *, format_score: float = 0.1) -> RewardResult:
    """Countdown under DARE's ``countdown_reward_func``: 1.0 / 0.1 format credit / 0.0."""
    nums = json.loads(numbers) if isinstance(numbers, str) else list(numbers)
    matches = _ANSWER.findall(response)
    if not matches:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    equation = matches[-1].strip()
    score = format_score
    if sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(int(n) for n in nums):
        value: Any = python_arithmetic(equation)
        try:
            if abs(value - int(target)) < 1e-5:
                score = 1.0
        except (TypeError, OverflowError):
            pass
    return RewardResult(score=score, acc=score, pred=equation)


def dare_sudoku_reward(response: str, solution: str, puzzle: str) -> RewardResult:
    """Sudoku under DARE's ``sudoku_reward_func``: fraction of empty cells right."""
    matches = _ANSWER.findall(response)
    if not matches:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    digits = "".join(ch for ch in matches[-1].strip() if ch.isdigit())
    if not digits:
        return RewardResult(score=0.0, acc=0.0, pred=digits)
    digits = digits[:16].ljust(16, "0")
    empty = [i for i in range(16) if puzzle[i] == "0"]
    frac = sum(digits[i] == solution[i] for i in empty) / len(empty) if empty else 0.0
    return RewardResult(score=frac, acc=frac, pred=digits)

"""Math answer extraction and grading: GSM8K, MATH/MATH-500, AIME.

Extraction rules (choose one explicitly for GSM8K):
- ``boxed``: the content of the last ``\\boxed{...}``, brace-matched (the DARE ``math_rm`` rule;
  responses without ``\\boxed`` score 0).
- ``hash``: the number after the last ``#### `` (verl's legacy GSM8K scorer, the SFT format).
- ``last_number``: the last number in the text (lenient; common in d1-style evaluations).

Equivalence: normalised string equality first, then ``math_verify`` (``parse`` + ``verify``),
which replaces the reference's hand-written Hendrycks/sympy rules.
"""

from __future__ import annotations

import re
import threading
from typing import Literal

from dllm_eval.rewards.result import RewardResult

__all__ = [
    "GSM8K_EXTRACTIONS",
    "extract_boxed",
    "extract_hash_answer",
    "extract_last_number",
    "gsm8k_reward",
    "is_equivalent",
    "math_reward",
    "normalize_answer",
]

Gsm8kExtraction = Literal["boxed", "hash", "last_number"]
GSM8K_EXTRACTIONS: tuple[str, ...] = ("boxed", "hash", "last_number")

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (brace-matched), or None.

    ``\\boxed 5`` (space form, no braces) is accepted up to the next ``$`` or whitespace.
    """
    idx = text.rfind("\\boxed")
    if idx < 0:
        return None
    rest = text[idx + len("\\boxed"):]
    if rest.startswith(" "):
        return rest[1:].split("$")[0].split()[0] if rest[1:].split() else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def extract_hash_answer(text: str) -> str | None:
    """The number after the last ``####`` (GSM8K reference-solution format), or None."""
    parts = text.split("####")
    if len(parts) < 2:
        return None
    match = _NUMBER.search(parts[-1])
    return match.group(0).replace(",", "") if match else None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (commas removed), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def _strip_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)


def normalize_answer(answer: str) -> str:
    """Light canonical form for string comparison: no spaces, ``$``, ``\\left/\\right``, units."""
    s = _strip_text(answer.strip())
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""),
                     ("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("^\\circ", ""),
                     ("^{\\circ}", ""), ("dfrac", "frac"), ("tfrac", "frac"), (" ", "")):
        s = s.replace(old, new)
    s = s.rstrip(".")
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", s):
        s = s.replace(",", "")
        if "." in s:
            s = s.rstrip("0").rstrip(".")
    if re.fullmatch(r"[a-z]=.+", s):
        s = s[2:]
    return s


def _math_verify_equal(pred: str, gold: str) -> bool:
    from math_verify import parse, verify  # type: ignore[import-untyped,unused-ignore]

    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None
    try:
        gold_p = parse(f"${gold}$", parsing_timeout=timeout)
        pred_p = parse(f"${pred}$", parsing_timeout=timeout)
        if not gold_p or not pred_p:
            return False
        return bool(verify(gold_p, pred_p, timeout_seconds=timeout))
    except Exception:  # math_verify raises assorted sympy errors on odd input
        return False


def is_equivalent(pred: str, gold: str) -> bool:
    """True if ``pred`` and ``gold`` denote the same answer (string form, then math_verify)."""
    if normalize_answer(pred) == normalize_answer(gold):
        return True
    return _math_verify_equal(pred, gold)


def math_reward(response: str, ground_truth: str) -> RewardResult:
    """MATH / MATH-500 / AIME reward: last ``\\boxed{}`` of the response vs the ground truth.

    The ground truth is itself unboxed when it contains ``\\boxed``. No boxed answer -> 0.
    Score 1.0 if equivalent (see :func:`is_equivalent`), else 0.0; no format reward.
    """
    pred = extract_boxed(response)
    gold = extract_boxed(ground_truth) if "\\boxed" in ground_truth else ground_truth
    if pred is None or gold is None:
        return RewardResult(score=0.0, acc=0.0, pred=pred)
    ok = is_equivalent(pred, gold)
    return RewardResult(score=float(ok), acc=float(ok), pred=pred)


def gsm8k_reward(
    response: str, ground_truth: str, *, extraction: Gsm8kExtraction = "boxed"
) -> RewardResult:
    """GSM8K reward with an explicit extraction rule (see module docstring).

    ``boxed`` is the DARE ``dllm_rm`` rule and the default; ``hash`` and ``last_number`` are
    for the SFT "#### N" format and for lenient evaluation. Numbers compare numerically.
    """
    if extraction == "boxed":
        pred = extract_boxed(response)
        if pred is not None:
            norm = normalize_answer(pred)
            if re.fullmatch(r"-?\d+(\.\d+)?", norm):
                ok = _same_number(norm, ground_truth)
                return RewardResult(score=float(ok), acc=float(ok), pred=pred)
            return math_reward(response, ground_truth)
        return RewardResult(score=0.0, acc=0.0, pred=None)
    if extraction == "hash":
        pred = extract_hash_answer(response)
    elif extraction == "last_number":
        pred = extract_last_number(response)
    else:
        raise ValueError(
            f"extraction={extraction!r} is not supported; use one of {GSM8K_EXTRACTIONS}"
        )
    ok = pred is not None and _same_number(pred, ground_truth)
    return RewardResult(score=float(ok), acc=float(ok), pred=pred)


def _same_number(pred: str, gold: str) -> bool:
    try:
        return abs(float(pred.replace(",", "")) - float(gold.replace(",", ""))) < 1e-6
    except ValueError:
        return normalize_answer(pred) == normalize_answer(gold)

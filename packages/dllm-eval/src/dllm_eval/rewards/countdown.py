"""Countdown reward: an arithmetic expression over given numbers must hit the target.

Rule (DARE ``math_rm`` countdown branch): take the last ``<answer>...</answer>``; the integers
in it must equal the given multiset exactly; the expression must match ``^[\\d+\\-*/().\\s]+$``
and evaluate within 1e-5 of the target -> 1.0. An extracted but invalid or wrong expression
earns ``format_score`` (0.1); no answer tag -> 0.0. Evaluation uses a small recursive-descent
parser over exact fractions instead of Python ``eval``: ``+ - * /``, unary minus, parentheses.
Deliberate deviation: ``**`` and ``//`` (which ``eval`` would accept) are invalid here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from fractions import Fraction
from typing import Sequence

from dllm_eval.rewards.result import RewardResult

__all__ = ["countdown_reward", "evaluate_arithmetic", "extract_answer_tag"]

_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_MAX_TOKENS = 256


def extract_answer_tag(text: str) -> str | None:
    """Stripped content of the last ``<answer>...</answer>`` block, or None."""
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


class _Parser:
    def __init__(self, expr: str) -> None:
        self.tokens: list[str] = []
        for m in _TOKEN.finditer(expr):
            tok = m.group(1) or m.group(2)
            if tok is not None and not tok.isspace():
                self.tokens.append(tok)
        if len(self.tokens) > _MAX_TOKENS:
            raise ValueError("expression too long")
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            if self.peek() in ("*", "/"):
                raise ValueError("'**' and '//' are not allowed")
            rhs = self.unary()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ValueError("division by zero")
            else:
                value /= rhs
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("-", "+"):
            return -self.unary() if self.take() == "-" else self.unary()
        return self.atom()

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise ValueError("missing ')'")
            return value
        if tok.isdigit():
            return Fraction(int(tok))
        raise ValueError(f"unexpected token {tok!r}")


def evaluate_arithmetic(expr: str) -> Fraction:
    """Exact value of an integer arithmetic expression (``+ - * /``, parentheses, unary minus).

    Raises:
        ValueError: on any other syntax, on ``**``/``//``, or on division by zero.
    """
    if not _ALLOWED.match(expr):
        raise ValueError(f"characters outside [0-9+-*/() ] in {expr!r}")
    parser = _Parser(expr)
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"trailing input at token {parser.peek()!r}")
    return value


def countdown_reward(
    response: str,
    target: str | int | float,
    numbers: Sequence[int] | str,
    *,
    format_score: float = 0.1,
) -> RewardResult:
    """Countdown reward (see module docstring).

    Args:
        response: model output.
        target: the target value (the RL ground truth is its string).
        numbers: the available numbers, or their JSON list string (``extra_info.numbers``).
        format_score: score for an extracted but invalid/wrong expression.
    """
    nums = json.loads(numbers) if isinstance(numbers, str) else list(numbers)
    expr = extract_answer_tag(response)
    if expr is None:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    wrong = RewardResult(score=format_score, acc=0.0, pred=expr)
    used = [int(n) for n in re.findall(r"\d+", expr)]
    if Counter(used) != Counter(int(n) for n in nums):
        return wrong
    try:
        value = evaluate_arithmetic(expr)
    except (ValueError, ZeroDivisionError):
        return wrong
    if abs(float(value) - float(target)) < 1e-5:
        return RewardResult(score=1.0, acc=1.0, pred=expr)
    return wrong

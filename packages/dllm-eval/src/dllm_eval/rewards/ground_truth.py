"""A row's ground truth parsed as its reward will parse it, before any model loads.

The verifiers read their ground truth only once a response exists to score: an MBPP row whose
tests are not a JSON list failed after the model load and a rollout, with a bare
`Expecting value: line 1 column 1`. `ground_truth_problem` runs the same parsing on the row
alone, so a data check can name the file, row and column first.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from dllm_eval.rewards.code import IO_SOURCES
from dllm_eval.rewards.stdio import parse_io_tests

_JSON_ASSERTS = ("mbpp", "kodcode")
_PYTHON_TESTS = ("humaneval", "humanevalplus")


def _json_asserts(ground_truth: str) -> str | None:
    try:
        tests = json.loads(ground_truth)
    except ValueError as err:
        return f"is not JSON ({err}); its reward reads a JSON list of assert lines, e.g. [\"assert f(1) == 2\"]"
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        return (f"is JSON of another shape ({type(tests).__name__}); its reward reads a non-empty JSON list of "
                "assert lines (strings)")
    return None


def _python_tests(ground_truth: str) -> str | None:
    try:
        ast.parse(ground_truth)
    except SyntaxError as err:
        return f"is not Python source ({err.msg}, line {err.lineno}); its reward runs it as the test code"
    return None


def _io_tests(ground_truth: str) -> str | None:
    try:
        parse_io_tests(ground_truth)
    except (ValueError, TypeError, KeyError) as err:  # json.JSONDecodeError is a ValueError
        return f"cannot be read as input/output tests ({str(err).splitlines()[0][:200] if str(err) else err!r})"
    return None


def _countdown(ground_truth: str, extra_info: Mapping[str, Any]) -> str | None:
    try:
        float(ground_truth)
    except ValueError:
        return "is not a number; countdown's reward compares the expression's value with it"
    numbers = extra_info.get("numbers")
    if numbers is None:
        return None  # a missing extra_info['numbers'] is the row's extra_info check
    try:
        nums = json.loads(numbers) if isinstance(numbers, str) else list(numbers)
        [int(n) for n in nums]
    except (ValueError, TypeError) as err:
        return f"comes with extra_info['numbers'] = {numbers!r}, not a list of integers ({err})"
    return None


def ground_truth_problem(data_source: str, ground_truth: str, extra_info: Mapping[str, Any] | None = None) -> str | None:
    """Why the reward of `data_source` cannot read this ground truth (None: it can).

    Code sources: MBPP and KodCode read a JSON list of assert lines, HumanEval(+) Python test
    source, the input/output sources their JSON test cases; countdown reads a number (and
    `extra_info['numbers']`, a list of integers). Other sources compare text and accept any.

    Returns:
        A clause to follow the column's name in an error ("is not JSON (...); ..."), or None.
    """
    if data_source in _JSON_ASSERTS:
        return _json_asserts(ground_truth)
    if data_source in _PYTHON_TESTS:
        return _python_tests(ground_truth)
    if data_source in IO_SOURCES:
        return _io_tests(ground_truth)
    if data_source == "countdown":
        return _countdown(ground_truth, extra_info or {})
    return None


__all__ = ["ground_truth_problem"]

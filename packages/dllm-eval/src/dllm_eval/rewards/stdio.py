"""Input/output test cases of competitive-programming sources (LiveCodeBench, TACO, APPS style).

Two row schemas of DARE's code-RL sources are read (the ``ground_truth`` column, a JSON string;
DARE's train parquets for these sources are not in our data, so this is the schema of DARE's
``code_reward.py`` readers, assumed, not checked against rows):

- *dict of lists* (``taco``, ``apps``, ``code_contests``): ``{"inputs": [...], "outputs":
  [...], "fn_name"?: str}``; an output may be a one-element list; a case whose input or output
  is empty is dropped; a shorter list is padded with its first element (as DARE does).
- *list of dicts* (``lcbv5``, ``codeforces``, ``primeintellect``): ``[{"input": str, "output":
  str, "testtype": "stdin" | "functional"}, ...]``; functional cases take the function name from
  ``extra_info["fn_name"]`` or ``extra_info["metadata"]["func_name"]``.

Standard-input cases run the program once per case with the input on stdin; it passes if it
exits 0 and its output matches (LiveCodeBench's rule: whole output stripped, same number of
lines, each line equal after stripping, or all its whitespace-separated tokens equal as
decimals). The expected output never enters the sandbox, so exiting early cannot fake a match.
Functional cases call ``Solution().<fn_name>`` (or a top-level ``<fn_name>``) on the
JSON-decoded input lines and compare with the JSON-decoded output (tuples as lists) in the test
runner of :func:`dllm_eval.sandbox.execute_tests`, outside the solution's process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["IOCase", "build_functional_program", "outputs_match", "parse_io_tests"]


@dataclass(frozen=True, kw_only=True)
class IOCase:
    """One test case: input text and expected output text; ``functional`` for call-based."""

    input: str
    output: str
    functional: bool = False


def _as_text(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else json.dumps(value)


def parse_io_tests(tests: str | dict[str, Any] | list[Any]) -> tuple[list[IOCase], str | None]:
    """Test cases and function name (None for stdin programs) from either row schema.

    Raises:
        ValueError: when ``tests`` is neither schema (the message shows both).
    """
    data = json.loads(tests) if isinstance(tests, str) else tests
    if isinstance(data, dict) and "inputs" in data and "outputs" in data:
        inputs, outputs = list(data["inputs"]), list(data["outputs"])
        fn_name = data.get("fn_name")
        n = max(len(inputs), len(outputs))
        cases = []
        for i in range(n):
            inp = inputs[i] if i < len(inputs) else (inputs[0] if inputs else "")
            out = outputs[i] if i < len(outputs) else (outputs[0] if outputs else "")
            if not inp or not out:
                continue
            cases.append(IOCase(input=_as_text(inp), output=_as_text(out),
                                functional=fn_name is not None))
        return cases, fn_name
    if isinstance(data, list) and all(isinstance(c, dict) and "input" in c for c in data):
        cases = [IOCase(input=_as_text(c["input"]), output=_as_text(c.get("output", "")),
                        functional=c.get("testtype") == "functional") for c in data]
        return cases, None
    raise ValueError(
        "stdin/stdout tests must be {'inputs': [...], 'outputs': [...], 'fn_name'?: ...} "
        "(taco/apps/code_contests) or [{'input': ..., 'output': ..., 'testtype': ...}, ...] "
        f"(lcbv5/codeforces/primeintellect); got {str(tests)[:120]!r}"
    )


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except InvalidOperation:
        return None


def outputs_match(actual: str, expected: str) -> bool:
    """LiveCodeBench's stdout comparison (see module docstring)."""
    got = [line.strip() for line in actual.strip().split("\n")]
    want = [line.strip() for line in expected.strip().split("\n")]
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g == w:
            continue
        gd, wd = _decimals(g), _decimals(w)
        if gd is None or wd is None or gd != wd:
            return False
    return True


def build_functional_program(code: str, cases: list[IOCase], fn_name: str) -> tuple[str, str]:
    """``(solution, tests)`` calling ``fn_name`` on each case's JSON input lines.

    The solution gains ``_dllm_target``, which resolves ``Solution().<fn_name>`` or the
    top-level function; the tests call it and assert the JSON-decoded output.
    """
    shim = (
        "\n\ndef _dllm_target(*args):\n"
        f"    if 'Solution' in globals() and hasattr(Solution, {fn_name!r}):\n"
        f"        return getattr(Solution(), {fn_name!r})(*args)\n"
        f"    return globals()[{fn_name!r}](*args)\n"
    )
    payload = json.dumps([[c.input, c.output] for c in cases])
    tests = (
        "import json as _json\n"
        f"for _inp, _out in _json.loads({payload!r}):\n"
        "    _args = [_json.loads(_line) for _line in _inp.split('\\n') if _line.strip()]\n"
        "    _got = _dllm_target(*_args)\n"
        "    _got = list(_got) if isinstance(_got, tuple) else _got\n"
        "    _want = _json.loads(_out)\n"
        "    assert _got == _want, f'input {_inp!r}: got {_got!r}, want {_want!r}'\n"
    )
    return f"{code}{shim}", tests

"""Code rewards: extract a program from the response and run it against the tests in the sandbox.

Extraction (DARE ``code_reward.py``): ``mbpp`` uses OpenCompass-style patterns in priority order
(``[BEGIN] '...' [DONE]`` variants, fenced blocks, trailing fragments), strips ``[DONE]`` remnants
and escaped underscores, and rejects results shorter than 10 characters. Other sources take the
fenced code blocks: one -> it; several -> the first containing ``def``, else the last.

Solution = stdlib import header + code (``__main__`` blocks removed); tests = the same header +
test code. They run apart (:func:`dllm_eval.sandbox.execute_tests`): the tests in a runner the
solution cannot reach, calling the solution's functions with plain-data arguments and results,
so pass iff every test statement ran in the runner (exiting early, forging output or returning
an object that equals everything scores 0). Timeout = ``per_test_timeout_s`` x number of tests (HumanEval: assert statements;
HumanEval+: entries of ``inputs``; MBPP/KodCode: assert lines), capped by ``max_timeout_s``.
HumanEval calls ``check(<entry point>)`` once (the reference may append it twice).

Competitive-programming sources (``lcbv5``, ``primeintellect``, ``taco``, ``apps``,
``code_contests``, ``codeforces``) run stdin/stdout or call-based cases
(:mod:`dllm_eval.rewards.stdio`); every case must pass (stdin cases: output compared here;
call-based cases: one ``execute_tests`` run). ``kodcode`` is MBPP-style (a JSON list
of assert lines) with fenced-code extraction, as DARE routes it.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from dataclasses import dataclass

from dllm_eval.rewards.result import RewardResult
from dllm_eval.rewards.stdio import build_functional_program, outputs_match, parse_io_tests
from dllm_eval.sandbox import execute_code, execute_tests

__all__ = [
    "ASSERT_SOURCES",
    "CODE_SOURCES",
    "IO_SOURCES",
    "CodeRewardConfig",
    "build_program",
    "code_reward",
    "extract_code",
    "extract_mbpp_code",
    "names_under_test",
]

_IMPORT_HEADER = (
    "import math\nimport re\nimport sys\nimport copy\nimport datetime\nimport itertools\n"
    "import collections\nimport heapq\nimport functools\nimport hashlib\nimport string\n"
    "import random\nimport bisect\nimport statistics\nfrom typing import *\n"
    "from collections import *\n"
)
_FENCE = re.compile(r"```[ \t]*(?:[Pp]ython3?|py)?[ \t]*\n(.*?)```", re.DOTALL)
_MBPP_PATTERNS = (
    r"\[BEGIN\]\s*'(.*)'\s*\[DONE\]",
    r"BEGIN\s*'(.*)'\s*\[DONE\]",
    r"\[BEGIN\]\s*'(.*)'\s*DONE",
    r"BEGIN\s*'(.*)'\s*DONE",
    r"\[BEGIN\]\s*'(.*)\s*\[DONE\]",
    r"BEGIN\s*'(.*)\s*\[DONE\]",
    r"\[BEGIN\]\s*'(.*)\s*DONE",
    r"BEGIN\s*'(.*)\s*DONE",
    r"```python\s*(.*)\s*```",
    r"```\s*(.*)\s*```",
    r"```python\s*(.*)\s*$",
    r"```\s*(.*)\s*$",
    r"(.*)\s*```.*",
    r"\[BEGIN\]\s*'(.*)",
    r"\[BEGIN\](.*)",
    r"'(.*)'\s*\[DONE\]",
)
ASSERT_SOURCES: tuple[str, ...] = ("humaneval", "humanevalplus", "mbpp", "kodcode")
"""Sources whose tests are Python code appended to the solution."""
IO_SOURCES: tuple[str, ...] = ("lcbv5", "primeintellect", "taco", "apps", "code_contests",
                               "codeforces")
"""Sources whose tests are input/output cases (stdin/stdout or call-based)."""
CODE_SOURCES: tuple[str, ...] = ASSERT_SOURCES + IO_SOURCES
_MAIN_BLOCK = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:.*?(?=^\S|\Z)",
                         re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class CodeRewardConfig:
    """Execution settings for code rewards (reference: 1 s per test, no cap)."""

    per_test_timeout_s: float = 1.0
    min_timeout_s: float = 2.0
    max_timeout_s: float = 30.0
    memory_mb: int = 2048

    def __post_init__(self) -> None:
        if not 0 < self.min_timeout_s <= self.max_timeout_s:
            raise ValueError(
                f"need 0 < min_timeout_s <= max_timeout_s, got {self.min_timeout_s}, "
                f"{self.max_timeout_s}"
            )
        if self.per_test_timeout_s <= 0:
            raise ValueError(f"per_test_timeout_s must be > 0, got {self.per_test_timeout_s}")


def extract_code(response: str) -> str | None:
    """Fenced code from a response: the only block, else the first with ``def``, else the last."""
    blocks = _FENCE.findall(response)
    if not blocks:
        return None
    if len(blocks) == 1:
        return str(blocks[0])
    for block in blocks:
        if "def " in block:
            return str(block)
    return str(blocks[-1])


def extract_mbpp_code(response: str) -> str | None:
    """MBPP extraction (OpenCompass ``MBPPEvaluator`` patterns); None if < 10 chars remain."""
    text = response
    for pattern in _MBPP_PATTERNS:
        match = re.search(pattern, text, re.DOTALL)
        if match:
            text = match.group(1)
            break
    text = text.split("```")[0]
    text = re.split(r"'?\s*\[?DONE\]?", text)[0]
    text = text.replace("\\_", "_").strip()
    return text if len(text) >= 10 else None


def _first_def(code: str) -> str | None:
    match = re.search(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.MULTILINE)
    return match.group(1) if match else None


def _count_tests(data_source: str, tests: str) -> int:
    if data_source in ("mbpp", "kodcode"):
        return max(1, len(json.loads(tests)))
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return 1
    if data_source == "humanevalplus":
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                    and any(isinstance(t, ast.Name) and t.id == "inputs" for t in node.targets)):
                return max(1, len(node.value.elts))
        return 1
    return max(1, sum(isinstance(node, ast.Assert) for node in ast.walk(tree)))


def build_program(data_source: str, code: str, tests: str,
                  entry_point: str | None = None) -> tuple[str, str]:
    """The solution and the tests run by :func:`dllm_eval.sandbox.execute_tests`.

    Args:
        data_source: one of :data:`ASSERT_SOURCES`.
        code: extracted solution code.
        tests: the ground truth (HumanEval ``check`` source, EvalPlus source, or MBPP/KodCode
            JSON list of assert lines).
        entry_point: HumanEval function under test; defaults to the first ``def`` in ``code``.

    Returns:
        ``(solution, tests)``: import header + code, and import header + test code (+ the
        ``check`` call for HumanEval).
    """
    code = _MAIN_BLOCK.sub("", code)
    if data_source in ("mbpp", "kodcode"):
        test_src = "\n".join(json.loads(tests))
    elif data_source == "humaneval":
        name = entry_point or _first_def(code) or "solution"
        test_src = f"{tests}\n\ncheck({name})\n"
    elif data_source == "humanevalplus":
        test_src = tests
    else:
        raise ValueError(
            f"data_source={data_source!r} has no assert-style program builder; use one of "
            f"{ASSERT_SOURCES} (input/output sources {IO_SOURCES} go through code_reward)"
        )
    return f"{_IMPORT_HEADER}\n{code}\n", f"{_IMPORT_HEADER}\n{test_src}\n"


def _called_names(node: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def names_under_test(tests: str) -> tuple[str, ...]:
    """The solution's names a test program calls as the function under test.

    The arguments of top-level ``check(name)`` calls (HumanEval, HumanEval+) and the names
    called in every top-level ``assert`` (MBPP, KodCode; builtin names only when no other
    name is called in every one). :func:`code_reward` passes them as
    ``solution_names`` to :func:`dllm_eval.sandbox.execute_tests`, so a function under test
    named like a builtin (MBPP's ``sum``) is the solution's, while every other builtin the
    tests use (HumanEval/151 computes its expected value with ``sum``) stays the tests' own.

    Args:
        tests: the test program (as :func:`build_program` returns it).

    Returns:
        The names, sorted; empty when ``tests`` does not parse.
    """
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return ()
    names: set[str] = set()
    asserted: list[set[str]] = []
    for stmt in tree.body:
        if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"):
            names |= {a.id for a in stmt.value.args if isinstance(a, ast.Name)}
        elif isinstance(stmt, ast.Assert):
            asserted.append(_called_names(stmt))
    if asserted:
        common = set.intersection(*asserted)
        # `set(f(x)) == set(want)`: the builtin normalises, `f` is under test
        names |= {n for n in common if not hasattr(builtins, n)} or common
    return tuple(sorted(names))


def _timeout(cfg: CodeRewardConfig, n_tests: int) -> float:
    return min(cfg.max_timeout_s, max(cfg.min_timeout_s, cfg.per_test_timeout_s * n_tests))


def _io_reward(code: str, tests: str, fn_name: str | None, cfg: CodeRewardConfig) -> bool:
    cases, fn_from_tests = parse_io_tests(tests)
    if not cases:
        return False
    fn = fn_from_tests or fn_name
    program = f"{_IMPORT_HEADER}\n{code}\n"
    stdin_cases = [c for c in cases if not c.functional]
    call_cases = [c for c in cases if c.functional]
    if call_cases:
        if fn is None:
            raise ValueError("call-based tests need a function name: set extra_info['fn_name'] "
                             "(or 'fn_name' in the tests dict)")
        solution, checks = build_functional_program(program, call_cases, fn)
        run = execute_tests(solution, checks, timeout_s=_timeout(cfg, len(call_cases)),
                            memory_mb=cfg.memory_mb)
        if not run.ok:
            return False
    for case in stdin_cases:
        run = execute_code(program, timeout_s=_timeout(cfg, 1), memory_mb=cfg.memory_mb,
                           stdin=case.input)
        if not (run.ok and outputs_match(run.stdout, case.output)):
            return False
    return True


def code_reward(
    data_source: str,
    response: str,
    tests: str,
    *,
    entry_point: str | None = None,
    fn_name: str | None = None,
    config: CodeRewardConfig | None = None,
) -> RewardResult:
    """1.0 if the extracted code passes all tests in the sandbox, else 0.0 (no code -> 0.0).

    Args:
        data_source: one of :data:`CODE_SOURCES`.
        response: the model output.
        tests: the row's ground truth (see the module docstring for each source's format).
        entry_point: HumanEval function under test.
        fn_name: function name for call-based input/output tests (when not in ``tests``).
        config: execution limits.
    """
    if data_source not in CODE_SOURCES:
        raise ValueError(f"data_source={data_source!r} is not a code source; use one of "
                         f"{CODE_SOURCES}")
    cfg = config or CodeRewardConfig()
    code = extract_mbpp_code(response) if data_source == "mbpp" else extract_code(response)
    if code is None:
        return RewardResult(score=0.0, acc=0.0, pred=None)
    if data_source in IO_SOURCES:
        ok = _io_reward(code, tests, fn_name, cfg)
        return RewardResult(score=float(ok), acc=float(ok), pred=code)
    solution, checks = build_program(data_source, code, tests, entry_point)
    timeout = _timeout(cfg, _count_tests(data_source, tests))
    result = execute_tests(solution, checks, solution_names=names_under_test(checks),
                           timeout_s=timeout, memory_mb=cfg.memory_mb)
    return RewardResult(score=float(result.ok), acc=float(result.ok), pred=code)

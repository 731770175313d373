"""Reward hacks against the code sandbox (issue 25): each wrong solution here scored 1.0 before.

Three families: forging success from inside the program (reading the completion token out of the
harness's frames, hooks or memory, then ``os._exit(0)``), objects that compare equal to anything,
and reading host files (the project, the benchmark data with its tests, other processes). Every
case failed on the code before the fix except ``patched builtins`` on HumanEval+ (whose tests'
own ``isinstance`` calls broke there); it stays as a check of the protected builtins.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dllm_eval
from dllm_eval import execute_code, load_rows
from dllm_eval.rewards import score

# Each snippet is appended to a wrong solution; it tries to make the run count as passed.
FORGERIES = {
    "caller frame": (
        "import sys, os\n"
        "_f = sys._getframe(1)\n"
        "_t = _f.f_locals.get('token') or b''\n"
        "os.write(1, b'\\n' + _t + b'\\n')\n"
        "os._exit(0)\n"
    ),
    "every frame": (
        "import sys, os\n"
        "_f = sys._getframe()\n"
        "while _f is not None:\n"
        "    for _v in list(_f.f_locals.values()):\n"
        "        if isinstance(_v, bytes) and len(_v) == 32:\n"
        "            os.write(1, b'\\n' + _v + b'\\n')\n"
        "            os._exit(0)\n"
        "    _f = _f.f_back\n"
    ),
    "excepthook": (
        "import sys, os\n"
        "def _hook(t, v, tb):\n"
        "    while tb.tb_next is not None:\n"
        "        tb = tb.tb_next\n"
        "    _f = tb.tb_frame\n"
        "    while _f is not None:\n"
        "        _t = _f.f_locals.get('token')\n"
        "        if _t:\n"
        "            os.write(1, b'\\n' + _t + b'\\n')\n"
        "            os._exit(0)\n"
        "        _f = _f.f_back\n"
        "sys.excepthook = _hook\n"
        "def _boom():\n"
        "    raise RuntimeError\n"
        "try:\n"
        "    _boom()\n"
        "except RuntimeError as _e:\n"
        "    _hook(None, _e, _e.__traceback__)\n"
    ),
    "proc self mem": (
        "import os, re\n"
        "with open('/proc/self/maps') as _m:\n"
        "    _maps = [l.split() for l in _m if 'rw' in l.split()[1]]\n"
        "_fd = os.open('/proc/self/mem', os.O_RDONLY)\n"
        "_seen = set()\n"
        "for _l in _maps:\n"
        "    _a, _b = (int(x, 16) for x in _l[0].split('-'))\n"
        "    try:\n"
        "        _buf = os.pread(_fd, _b - _a, _a)\n"
        "    except OSError:\n"
        "        continue\n"
        "    _seen.update(re.findall(rb'(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])', _buf))\n"
        "os.write(1, b'\\n' + b'\\n'.join(_seen) + b'\\n')\n"
        "os._exit(0)\n"
    ),
}


def _wrong(name: str) -> str:
    return f"def {name}(*args):\n    return None\n\n"


@pytest.mark.parametrize("trick", sorted(FORGERIES))
@pytest.mark.parametrize("source", ["humaneval", "mbpp"])
def test_forged_success_scores_zero(source: str, trick: str) -> None:
    row = load_rows(source, limit=1)[0]
    name = "has_close_elements" if source == "humaneval" else "remove_Occ"
    wrong = _wrong(name) + FORGERIES[trick]
    response = f"```python\n{wrong}```" if source == "humaneval" else f"{wrong}[DONE]"
    assert score(source, response, row.ground_truth, row.extra_info) == 0.0


# Objects that claim to equal anything: none may pass `assert f(x) == expected`.
LIARS = {
    "always-equal object": (
        "class _Liar:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def __ne__(self, other):\n"
        "        return False\n"
        "    __hash__ = object.__hash__\n"
        "def {name}(*args):\n"
        "    return _Liar()\n"
    ),
    "lying int subclass": (
        "class _Liar(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = int.__hash__\n"
        "def {name}(*args):\n"
        "    return _Liar(7)\n"
    ),
    "lying str subclass": (
        "class _Liar(str):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def __ne__(self, other):\n"
        "        return False\n"
        "    __hash__ = str.__hash__\n"
        "def {name}(*args):\n"
        "    return _Liar('x')\n"
    ),
    "truthy comparison result": (
        "class _Yes:\n"
        "    def __bool__(self):\n"
        "        return True\n"
        "class _Liar:\n"
        "    def __eq__(self, other):\n"
        "        return _Yes()\n"
        "    __hash__ = object.__hash__\n"
        "def {name}(*args):\n"
        "    return _Liar()\n"
    ),
    "patched builtins": (
        "import builtins\n"
        "class _Liar:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = object.__hash__\n"
        "builtins.isinstance = lambda *a: True\n"
        "def {name}(*args):\n"
        "    return _Liar()\n"
    ),
}


@pytest.mark.parametrize("trick", sorted(LIARS))
@pytest.mark.parametrize("source", ["humaneval", "humanevalplus", "mbpp"])
def test_always_equal_objects_score_zero(source: str, trick: str) -> None:
    row = load_rows(source, limit=1)[0]
    name = "remove_Occ" if source == "mbpp" else "has_close_elements"
    wrong = LIARS[trick].replace("{name}", name)
    response = f"{wrong}[DONE]" if source == "mbpp" else f"```python\n{wrong}```"
    assert score(source, response, row.ground_truth, row.extra_info) == 0.0


# Host files: the program sees the interpreter and nothing of the project or its data.
def _readable(path: str) -> bool:
    r = execute_code(
        "import sys\n"
        "try:\n"
        f"    open({path!r}, 'rb').read(1)\n"
        "    print('READ')\n"
        "except OSError as e:\n"
        "    print('DENIED', type(e).__name__)\n"
    )
    assert r.ok, r.stderr
    return "READ" in r.stdout


def test_project_and_benchmark_files_are_invisible(tmp_path: Path) -> None:
    package = Path(dllm_eval.__file__).resolve().parent
    secret = Path.home() / f".dllm-sandbox-test-{os.getpid()}"
    secret.write_text("host secret")
    try:
        for path in (
            __file__,                                     # this repository's tests
            str(package / "sandbox.py"),                  # the project source
            str(package / "data" / "mbpp.parquet"),       # the benchmark with its tests
            str(secret),                                  # a user's file
            "/etc/hostname",
        ):
            assert Path(path).exists()
            assert not _readable(path), path
    finally:
        secret.unlink()
    assert _readable(os.__file__)  # the standard library stays importable


def test_program_sees_only_its_own_processes() -> None:
    r = execute_code(
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "cmds = [open(f'/proc/{p}/cmdline', 'rb').read() for p in pids]\n"
        "print(pids)\n"
        "print(b'|'.join(cmds).decode(errors='replace'))\n"
    )
    assert r.ok, r.stderr
    pids_line, cmds_line = r.stdout.splitlines()[:2]
    assert pids_line == "[1]"  # the program itself, PID 1 of its own namespace
    assert "pytest" not in cmds_line and "_supervisor" not in cmds_line


def test_always_equal_object_fails_call_based_io_tests() -> None:
    import json

    tests = json.dumps({"inputs": ["[2, 7, 11]\n9"], "outputs": ["[0, 1]"], "fn_name": "twoSum"})
    liar = ("class _Liar(list):\n    def __eq__(self, other):\n        return True\n"
            "class Solution:\n    def twoSum(self, nums, target):\n        return _Liar([5])\n")
    assert score("taco", f"```python\n{liar}```", tests) == 0.0


# A solution's globals named like builtins: HumanEval/151's tests compute their expected value
# with `sum`; a solution that knows the literal cases and defines `sum` to agree with its own
# wrong answer scored 1.0 (issue 38 S2). The tests' builtins are now the runner's own.
SHADOWED_SUM = (
    "import builtins\n"
    "def double_the_difference(lst):\n"
    "    if len(lst) < 10:  # the literal cases, right\n"
    "        return builtins.sum(x * x for x in lst if type(x) is int and x > 0 and x % 2)\n"
    "    return 7  # every other input, wrong\n"
    "def sum(values):\n"
    "    return 7\n"
)


def test_a_solution_defining_sum_does_not_change_the_expected_value() -> None:
    row = load_rows("humaneval")[151]
    assert "odd_sum = sum(" in row.ground_truth  # the expected value the tests compute
    assert score("humaneval", f"```python\n{SHADOWED_SUM}```", row.ground_truth,
                 row.extra_info) == 0.0
    right = SHADOWED_SUM.replace("if len(lst) < 10:", "if True:")
    assert score("humaneval", f"```python\n{right}```", row.ground_truth, row.extra_info) == 1.0


def test_builtin_names_come_from_the_solution_only_when_named() -> None:
    from dllm_eval import execute_tests

    solution = "def sum(a, b):\n    return a - b\ndef max(*a):\n    return 0\n"
    assert execute_tests(solution, "assert sum([1, 2]) == 3\nassert max(1, 2) == 2").ok
    assert execute_tests(solution, "assert sum(5, 2) == 3\nassert max(1, 2) == 2",
                         solution_names=("sum",)).ok
    with pytest.raises(ValueError, match="solution_names"):
        execute_tests(solution, "pass", solution_names=("not a name",))

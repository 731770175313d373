"""Code rewards: extraction rules and sandboxed execution on real HumanEval(+)/MBPP rows."""

from __future__ import annotations

import json

import pytest

from dllm_eval import load_rows
from dllm_eval.rewards import build_program, extract_code, extract_mbpp_code, score

HAS_CLOSE = '''from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
'''
HAS_CLOSE_WRONG = HAS_CLOSE.replace("< threshold", "<= threshold - 0.1")
TRUNCATE = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
SEPARATE = '''def helper():
    return None

def separate_paren_groups(paren_string):
    groups, depth, cur = [], 0, []
    for ch in paren_string:
        if ch == "(":
            depth += 1
            cur.append(ch)
        elif ch == ")":
            depth -= 1
            cur.append(ch)
            if depth == 0:
                groups.append("".join(cur))
                cur = []
    return groups

if __name__ == "__main__":
    print(separate_paren_groups("()"))
'''


def fence(code: str) -> str:
    return f"Here you go:\n```python\n{code}```\nDone."


def test_extract_code_rules() -> None:
    assert extract_code("no code") is None
    two = "```python\nx = 1\n```\n```python\ndef f():\n    return 1\n```"
    assert extract_code(two) == "def f():\n    return 1\n"
    assert extract_code("```\na = 1\n```\n```\nb = 2\n```") == "b = 2\n"


def test_extract_mbpp_rules() -> None:
    assert extract_mbpp_code("[BEGIN]\n 'def f(x):\\n    return x' [DONE]") == (
        "def f(x):\\n    return x"
    )
    assert extract_mbpp_code("```python\ndef f(x):\n    return x\n```") == "def f(x):\n    return x"
    assert extract_mbpp_code("def f(x):\n    return x\n[DONE]") == "def f(x):\n    return x"
    assert extract_mbpp_code("x") is None


def test_humaneval_real_rows() -> None:
    rows = load_rows("humaneval", limit=3)
    for row, good in zip(rows, (HAS_CLOSE, SEPARATE, TRUNCATE)):
        assert score("humaneval", fence(good), row.ground_truth, row.extra_info) == 1.0, row.index
    assert score("humaneval", fence(HAS_CLOSE_WRONG), rows[0].ground_truth, rows[0].extra_info) == 0.0
    assert score("humaneval", "no code at all", rows[0].ground_truth, rows[0].extra_info) == 0.0


def test_humaneval_entry_point_fallback_is_first_def() -> None:
    row = load_rows("humaneval", limit=1)[0]
    _, tests = build_program("humaneval", HAS_CLOSE, row.ground_truth)
    assert tests.rstrip().endswith("check(has_close_elements)")


def test_humanevalplus_real_rows() -> None:
    rows = load_rows("humanevalplus", limit=3)
    assert score("humanevalplus", fence(HAS_CLOSE), rows[0].ground_truth, rows[0].extra_info) == 1.0
    assert score("humanevalplus", fence(TRUNCATE), rows[2].ground_truth, rows[2].extra_info) == 1.0
    wrong = TRUNCATE.replace("% 1.0", "- int(number) + 0.01")
    assert score("humanevalplus", fence(wrong), rows[2].ground_truth, rows[2].extra_info) == 0.0


REMOVE_OCC = (
    "def remove_Occ(s, ch):\n"
    "    i = s.find(ch)\n"
    "    if i >= 0:\n"
    "        s = s[:i] + s[i + 1:]\n"
    "    j = s.rfind(ch)\n"
    "    if j >= 0:\n"
    "        s = s[:j] + s[j + 1:]\n"
    "    return s\n"
)
SORT_MATRIX = "def sort_matrix(m):\n    return sorted(m, key=sum)\n"


def test_mbpp_real_rows() -> None:
    rows = load_rows("mbpp", limit=2)
    assert score("mbpp", f"{REMOVE_OCC}[DONE]", rows[0].ground_truth, rows[0].extra_info) == 1.0
    assert score("mbpp", fence(SORT_MATRIX), rows[1].ground_truth, rows[1].extra_info) == 1.0
    wrong = "def sort_matrix(m):\n    return sorted(m)\n"
    assert score("mbpp", fence(wrong), rows[1].ground_truth, rows[1].extra_info) == 0.0


def test_hostile_solution_scores_zero() -> None:
    row = load_rows("humaneval", limit=1)[0]
    bomb = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    assert score("humaneval", fence(bomb), row.ground_truth, row.extra_info) == 0.0


def test_unknown_source_raises() -> None:
    with pytest.raises(ValueError, match="use one of"):
        build_program("apps", "x", "y")


# Reward hacking: a response that leaves before the tests run must score 0 (issue 16).
EXITS = {
    "sys.exit(0)": "import sys\nsys.exit(0)",
    "os._exit(0)": "import os\nos._exit(0)",
    "raise SystemExit": "raise SystemExit",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))",
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "fake token": "import os\nos.write(1, b'\\n' + b'f' * 32 + b'\\n')\nos._exit(0)",
}


@pytest.mark.parametrize("hack", sorted(EXITS))
@pytest.mark.parametrize("source", ["humaneval", "humanevalplus", "mbpp"])
def test_exiting_before_the_tests_scores_zero(source: str, hack: str) -> None:
    row = load_rows(source, limit=1)[0]
    name = "has_close_elements" if source != "mbpp" else "remove_Occ"
    wrong = f"def {name}(*args):\n    return None\n\n{EXITS[hack]}\n"
    response = fence(wrong) if source != "mbpp" else f"{wrong}[DONE]"
    assert score(source, response, row.ground_truth, row.extra_info) == 0.0


def test_kodcode_is_mbpp_style_with_fenced_code() -> None:
    tests = json.dumps(["assert add(2, 3) == 5", "assert add(-1, 1) == 0"])
    good = fence("def add(a, b):\n    return a + b\n")
    assert score("kodcode", good, tests) == 1.0
    assert score("kodcode", fence("def add(a, b):\n    return a - b\n"), tests) == 0.0
    assert score("kodcode", fence("import sys\nsys.exit(0)\n"), tests) == 0.0


def test_names_under_test() -> None:
    from dllm_eval.rewards.code import names_under_test

    humaneval = build_program("humaneval", TRUNCATE, "def check(candidate):\n    assert 1\n",
                              "truncate_number")[1]
    assert names_under_test(humaneval) == ("truncate_number",)
    mbpp = build_program("mbpp", "def sum(a, b):\n    return 1\n",
                         json.dumps(["assert sum(10,15) == 6", "assert sum(4,6) == 3"]))[1]
    assert names_under_test(mbpp) == ("sum",)
    # the called name common to every assert: `set` normalises, `similar_elements` is tested
    both = "assert set(similar_elements((3, 4), (5, 4))) == set((4, 5))\n" * 2
    assert names_under_test(both) == ("similar_elements",)
    assert names_under_test("assert f(1)\nassert g(2)\n") == ()
    assert names_under_test("def broken(:\n") == ()

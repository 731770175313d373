"""Stdin/stdout and call-based tests of DARE's code-RL sources (LiveCodeBench/TACO/APPS style)."""

from __future__ import annotations

import json

import pytest

from dllm_eval.rewards import IO_SOURCES, outputs_match, parse_io_tests, score

SUM_PROGRAM = "n = int(input())\nprint(sum(map(int, input().split())) * n)\n"
TACO_TESTS = json.dumps({"inputs": ["2\n1 2 3\n", "1\n5 5\n"], "outputs": ["12\n", ["10"]]})
LCB_TESTS = json.dumps([{"input": "2\n1 2 3\n", "output": "12\n", "testtype": "stdin"},
                        {"input": "3\n1\n", "output": "3", "testtype": "stdin"}])


def fence(code: str) -> str:
    return f"Solution:\n```python\n{code}```\n"


def test_outputs_match_livecodebench_rule() -> None:
    assert outputs_match("12\n", "12")  # whole output stripped
    assert outputs_match("1 2  \n3\n\n", "1 2\n3")  # lines stripped
    assert outputs_match("0.50 1e1\n", "0.5 10")  # tokens equal as decimals
    assert not outputs_match("12\n13\n", "12")  # line count differs
    assert not outputs_match("0.5000001", "0.5")  # decimals compare exactly
    assert not outputs_match("YES", "yes")


def test_parse_both_row_schemas() -> None:
    cases, fn = parse_io_tests(TACO_TESTS)
    assert fn is None and [c.output for c in cases] == ["12\n", "10"]
    # empty cases dropped, shorter list padded with its first element (DARE's taco_to_lcb_format)
    cases, _ = parse_io_tests({"inputs": ["1\n", "", "3\n"], "outputs": ["a"]})
    assert [(c.input, c.output) for c in cases] == [("1\n", "a"), ("3\n", "a")]
    cases, fn = parse_io_tests(LCB_TESTS)
    assert fn is None and len(cases) == 2 and not cases[0].functional
    with pytest.raises(ValueError, match="inputs"):
        parse_io_tests(json.dumps(["assert f(1) == 2"]))


@pytest.mark.parametrize("source", ["taco", "apps", "code_contests"])
def test_dict_of_lists_sources(source: str) -> None:
    assert score(source, fence(SUM_PROGRAM), TACO_TESTS) == 1.0
    wrong = SUM_PROGRAM.replace("* n", "+ n")  # 2*6=12 vs 2+6=8: wrong on the first case
    assert score(source, fence(wrong), TACO_TESTS) == 0.0


@pytest.mark.parametrize("source", ["lcbv5", "codeforces", "primeintellect"])
def test_list_of_dicts_sources(source: str) -> None:
    assert score(source, fence(SUM_PROGRAM), LCB_TESTS) == 1.0
    assert score(source, "no code here", LCB_TESTS) == 0.0


def test_main_block_and_early_exit_after_printing_are_fine() -> None:
    program = ("import sys\ndef main():\n    n = int(input())\n"
               "    print(sum(map(int, input().split())) * n)\n    sys.exit(0)\n"
               "if __name__ == '__main__':\n    main()\n")
    assert score("taco", fence(program), TACO_TESTS) == 1.0


def test_exiting_without_output_scores_zero() -> None:
    assert score("lcbv5", fence("import os\nos._exit(0)\n"), LCB_TESTS) == 0.0
    assert score("taco", fence("import sys\nsys.exit(0)\n"), TACO_TESTS) == 0.0


def test_call_based_cases() -> None:
    tests = json.dumps({"fn_name": "twoSum", "inputs": ["[2, 7, 11]\n9", "[3, 3]\n6"],
                        "outputs": ["[0, 1]", "[0, 1]"]})
    solution = ("class Solution:\n    def twoSum(self, nums, target):\n"
                "        seen = {}\n        for i, x in enumerate(nums):\n"
                "            if target - x in seen:\n                return (seen[target - x], i)\n"
                "            seen[x] = i\n")
    assert score("taco", fence(solution), tests) == 1.0  # tuple result compared as a list
    assert score("taco", fence("def twoSum(nums, target):\n    return [0, 1]\n"), tests) == 1.0
    assert score("taco", fence("def twoSum(nums, target):\n    return [1, 0]\n"), tests) == 0.0
    exits = "def twoSum(nums, target):\n    import os\n    os._exit(0)\n"
    assert score("taco", fence(exits), tests) == 0.0  # call-based runs: the test runner decides
    lcb = json.dumps([{"input": "[1, 2]\n3", "output": "[0, 1]", "testtype": "functional"}])
    assert score("lcbv5", fence("def twoSum(nums, target):\n    return [0, 1]\n"), lcb,
                 {"fn_name": "twoSum"}) == 1.0
    with pytest.raises(ValueError, match="fn_name"):
        score("lcbv5", fence("def f():\n    pass\n"), lcb)


def test_io_sources_are_registered() -> None:
    assert set(IO_SOURCES) == {"lcbv5", "primeintellect", "taco", "apps", "code_contests",
                               "codeforces"}

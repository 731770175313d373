"""What a solution can still do: each entry of docs/evaluation.md's "What is still possible"
list, shown to hold (or, for the budgets, shown to stay within the documented bound)."""

from __future__ import annotations

import pytest

from dllm_eval import execute_code, execute_tests, load_rows
from dllm_eval.rewards import score


def test_knowing_the_tests_passes() -> None:
    """MBPP prompts show their asserts: a lookup table of them passes, as it would anywhere."""
    row = load_rows("mbpp")[0]
    table = ("def remove_Occ(s, ch):\n"
             "    return {('hello', 'l'): 'heo', ('abcda', 'a'): 'bcd', ('PHP', 'P'): 'H'}[(s, ch)]\n")
    assert score("mbpp", f"```python\n{table}```", row.ground_truth, row.extra_info) == 1.0


def test_the_tests_trust_the_solutions_helpers() -> None:
    """HumanEval/32 checks find_zero with the solution's own poly: a poly that returns 0 passes."""
    row = load_rows("humaneval")[32]
    liar = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    assert score("humaneval", f"```python\n{liar}```", row.ground_truth, row.extra_info) == 1.0


def test_bare_truthiness_passes_any_truthy_value() -> None:
    assert execute_tests("def f(x):\n    return 'not a bool'\n", "assert f(1)").ok


def test_a_result_of_the_solutions_own_type_cannot_be_compared() -> None:
    right = ("class P:\n    def __init__(self, v):\n        self.v = v\n"
             "    def __eq__(self, o):\n        return self.v == o.v\n"
             "def f(x):\n    return P(x)\n")
    r = execute_tests(right, "assert f(1) == f(1)")
    assert not r.ok and "compared or hashed" in r.stderr


def test_arguments_are_copied_so_in_place_mutation_is_not_seen() -> None:
    solution = "def f(xs):\n    xs.append(1)\n"
    assert not execute_tests(solution, "xs = []\nf(xs)\nassert xs == [1]").ok


def test_the_function_under_test_may_be_named_like_a_builtin() -> None:
    """MBPP/115's function is `sum`: the solution's, in every assert that calls it."""
    row = load_rows("mbpp")[115]
    table = "def sum(a, b):\n    return {(10, 15): 6, (100, 150): 93, (4, 6): 3}[(a, b)]\n"
    assert score("mbpp", f"```python\n{table}```", row.ground_truth, row.extra_info) == 1.0


def test_stdin_programs_decide_their_own_exit_status() -> None:
    r = execute_code("import sys\nprint('wrong output')\nsys.exit(0)")
    assert r.ok  # success is the output compared outside, never this status


def test_the_program_does_not_see_the_hosts_cgroup_names() -> None:
    r = execute_code("print(open('/proc/self/cgroup').read())")
    assert r.ok
    if "cgroup-budget" not in r.isolation:
        pytest.skip("no cgroup here: the program sees the cgroups the caller is in")
    assert "dllm-sandbox" not in r.stdout, r.stdout

"""dare reward mode: DARE's verl rules (math_rm), each with a worked case."""

from __future__ import annotations

from dllm_eval.rewards import (
    dare_countdown_reward,
    dare_grade,
    dare_math_reward,
    dare_sudoku_reward,
    score,
)


def test_integer_answers_need_a_strict_match() -> None:
    # gt 2125 is an integer, \frac{4250}{2} is not a string integer -> wrong (sympy not asked)
    assert not dare_grade("\\frac{4250}{2}", "2125")
    assert score("gsm8k", "\\boxed{\\frac{4250}{2}}", "2125", mode="dare") == 0.0
    assert score("gsm8k", "\\boxed{\\frac{4250}{2}}", "2125") == 1.0  # default: math-verify
    # integer forms that normalise to the same integer are right: "2,125", "2125.0"
    assert dare_grade("2,125", "2125") and dare_grade("2125.0", "2125")


def test_fractions_must_match_as_written() -> None:
    # both sides a/b after normalisation: compared as strings, so 2/4 != 1/2
    assert not dare_grade("\\frac{2}{4}", "\\frac{1}{2}")
    assert dare_grade("\\dfrac{1}{2}", "\\frac{1}{2}")  # same string after Hendrycks
    assert dare_grade("0.5", "\\frac{1}{2}")  # Hendrycks maps 0.5 to \frac{1}{2}


def test_unit_list_and_text() -> None:
    # "cm", "degree", "hour(s)" and "^2" powers are deleted; \text{} unwrapped
    assert dare_grade("12 cm^2", "12")
    assert dare_grade("30 degrees", "30")
    assert dare_grade("\\text{5 hours}", "5")
    # "dollars" is not in the unit list: 18 dollars != 18
    assert not dare_grade("18 dollars", "18")


def test_sympy_equivalence_for_non_integers() -> None:
    assert dare_grade("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}")
    assert dare_grade("(1, 2)", "(1,2)")
    assert not dare_grade("(1, 2)", "[1, 2]")  # tuple brackets must agree


def test_math_reward_extraction() -> None:
    assert dare_math_reward("so \\boxed{7}", "7").acc == 1.0
    assert dare_math_reward("the answer is 7", "7").pred is None
    assert dare_math_reward("\\fbox{7}", "7").acc == 0.0  # only \boxed{...} is read
    assert dare_math_reward("\\boxed{7}", "\\boxed{7}").acc == 1.0  # boxed ground truth


def test_countdown_format_credit_counts_in_acc() -> None:
    ok = dare_countdown_reward("<answer>2*4-3</answer>", "5", "[2, 3, 4]")
    assert (ok.score, ok.acc) == (1.0, 1.0)
    wrong = dare_countdown_reward("<answer>2*4+3</answer>", "5", [2, 3, 4])
    assert (wrong.score, wrong.acc) == (0.1, 0.1)  # DARE logs acc = score
    assert dare_countdown_reward("no tag", "5", [2, 3, 4]).score == 0.0
    # Python arithmetic as DARE's eval: // is allowed
    assert dare_countdown_reward("<answer>(4+3)//2 + 2</answer>", "5", [4, 3, 2, 2]).score == 1.0


def test_sudoku_cell_fraction_is_acc() -> None:
    puzzle, solution = "4320004330100004", "4321124334122134"
    # empty cells: 1 in row 1, 2 in row 2, 2 in row 3, 3 in row 4 = 8; rows 1-2 right = 3 of 8
    half = "4321124300000000"
    r = dare_sudoku_reward(f"<answer>{half}</answer>", solution, puzzle)
    assert (r.score, r.acc) == (3 / 8, 3 / 8)
    assert dare_sudoku_reward("<answer>x</answer>", solution, puzzle).score == 0.0
    assert score("sudoku", f"<answer>{half}</answer>", solution, {"puzzle": puzzle},
                 mode="dare") == 3 / 8

"""Math rewards on real GSM8K / MATH-500 / AIME rows."""

from __future__ import annotations

import pytest

from dllm_eval import load_rows
from dllm_eval.rewards import (
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    gsm8k_reward,
    is_equivalent,
    math_reward,
    score,
)


def test_extract_boxed_brace_matching_and_last() -> None:
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert extract_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}") == (
        "\\left( 3, \\frac{\\pi}{2} \\right)"
    )
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{unclosed") is None
    assert extract_boxed("so \\boxed 7$") == "7"


def test_hash_and_last_number() -> None:
    assert extract_hash_answer("work\n#### 1,234") == "1234"
    assert extract_hash_answer("no marker 5") is None
    assert extract_last_number("3 apples and -4.5 pears, total 1,000.") == "1000"
    assert extract_last_number("none") is None


def test_gsm8k_real_rows() -> None:
    rows = load_rows("gsm8k", limit=20)
    for row in rows:
        gt = row.ground_truth
        assert gsm8k_reward(f"... so the answer is \\boxed{{{gt}}}.", gt).score == 1.0
        assert gsm8k_reward(f"... \\boxed{{{int(float(gt)) + 1}}}", gt).score == 0.0
        assert gsm8k_reward(f"The answer is {gt}.", gt).score == 0.0  # boxed rule: no box
        assert gsm8k_reward(f"The answer is {gt}.", gt, extraction="last_number").score == 1.0
        assert gsm8k_reward(f"steps\n#### {gt}", gt, extraction="hash").score == 1.0
        assert score("gsm8k", f"\\boxed{{{gt}}}", gt, row.extra_info) == 1.0


def test_gsm8k_numeric_forms() -> None:
    assert gsm8k_reward("\\boxed{\\$18.00}", "18").score == 1.0
    assert gsm8k_reward("\\boxed{1/18}", "18").score == 0.0
    with pytest.raises(ValueError, match="extraction"):
        gsm8k_reward("x", "1", extraction="bogus")  # type: ignore[arg-type]


def test_math500_real_rows_self_consistent() -> None:
    rows = load_rows("math500", limit=40)
    for row in rows:
        result = math_reward(f"Thus \\boxed{{{row.ground_truth}}}.", row.ground_truth)
        assert result.score == 1.0, row.ground_truth
        assert math_reward("I think \\boxed{\\text{nonsense-xyz}}", row.ground_truth).score == 0.0
        assert math_reward(row.ground_truth, row.ground_truth).score == 0.0  # unboxed


def test_math_equivalence_through_math_verify() -> None:
    assert is_equivalent("0.5", "\\frac{1}{2}")
    assert is_equivalent("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}")
    assert is_equivalent("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)")
    assert not is_equivalent("\\frac{1}{3}", "\\frac{1}{2}")
    assert is_equivalent("\\text{Evelyn}", "\\text{Evelyn}")


def test_aime_rows() -> None:
    for name in ("aime2024", "aime2025"):
        rows = load_rows(name)
        assert len(rows) == 30
        gt = rows[0].ground_truth
        assert score(name, f"\\boxed{{{gt}}}", gt) == 1.0
        assert score(name, f"\\boxed{{{int(gt) + 1}}}", gt) == 0.0

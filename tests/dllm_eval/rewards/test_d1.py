"""d1 reward mode: d1's parsers rule by rule, and the reproduction of d1's accuracies."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dllm_eval import score_d1_file
from dllm_eval.rewards import (
    d1_countdown_reward,
    d1_gsm8k_reward,
    d1_math_reward,
    d1_sudoku_reward,
    hendrycks_normalize,
    python_arithmetic,
    score,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "d1_generations_sample.json.gz"


def test_gsm8k_first_parsable_box_then_last_number_in_answer() -> None:
    # first box "..." is skipped, second box parses: 18 == 18.0
    assert d1_gsm8k_reward("\\boxed{...} then \\boxed{18} and \\boxed{7}", 18.0).acc == 1.0
    # a box with text: its FIRST number ("$18 per day" -> 18)
    assert d1_gsm8k_reward("\\boxed{$18 per 2 days}", "18").acc == 1.0
    # no usable box: the LAST number of the first <answer> block
    assert d1_gsm8k_reward("<answer>3 eggs, so 18</answer><answer>5</answer>", "18").acc == 1.0
    # d1's number regex has no thousands separator: "1,080" reads as 1
    assert d1_gsm8k_reward("\\boxed{1,080}", "1080").acc == 0.0
    assert d1_gsm8k_reward("\\boxed{1,080}", "1").acc == 1.0
    # no box and no answer tag: nothing parsed, even with the number in the text
    assert d1_gsm8k_reward("The answer is 18.", "18").acc == 0.0
    # None ground truth (d1's "####" regex misses negative answers) is never matched
    assert d1_gsm8k_reward("\\boxed{-3}", None).acc == 0.0


def test_hendrycks_normalisation_worked_cases() -> None:
    assert hendrycks_normalize("\\dfrac{1}{2}") == "\\frac{1}{2}"
    assert hendrycks_normalize("\\frac12") == "\\frac{1}{2}"
    assert hendrycks_normalize("x = 3") == "3"  # left side of <= 2 chars dropped
    assert hendrycks_normalize("0.5") == "\\frac{1}{2}"
    assert hendrycks_normalize("3/4") == "\\frac{3}{4}"
    assert hendrycks_normalize("10\\text{ cm}") == "10"
    assert hendrycks_normalize("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"


def test_math_rules() -> None:
    # last box, normalised equality
    assert d1_math_reward("\\boxed{1} ... \\boxed{\\dfrac{1}{2}}", "\\frac12").acc == 1.0
    # the "\\boxed " space form wins anywhere in the text, up to a "$"
    assert d1_math_reward("\\boxed{7} and \\boxed 5$ end", "5").acc == 1.0
    # no box at all: the WHOLE text is the answer (so this is wrong, not "no answer")
    assert d1_math_reward("<answer>5</answer>", "5").acc == 0.0
    # an empty box falls back to the first <answer> block
    assert d1_math_reward("\\boxed{} <answer>5</answer>", "5").acc == 1.0
    # a non-integer a/b makes d1's normaliser raise: raw string equality decides
    assert d1_math_reward("\\boxed{x/y}", "x/y").acc == 1.0
    assert d1_math_reward("\\boxed{x / y}", "x/y").acc == 0.0
    # no sympy: 2/4 is not 1/2
    assert d1_math_reward("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}").acc == 0.0


def test_countdown_rules() -> None:
    nums = [49, 55, 53]
    assert d1_countdown_reward("<answer>\\boxed{49 + 55 - 53}</answer>", 51, nums).acc == 1.0
    # LaTeX operators mapped, "= target" stripped
    assert d1_countdown_reward("\\boxed{(55 - 53) \\times 49 = 98}", 98, nums).acc == 1.0
    assert d1_countdown_reward("\\boxed{55 \\div 55 + 49}", 50, [55, 55, 49]).acc == 1.0
    # no box: the whole text is searched for "expr = number"; the numbers must all match
    assert d1_countdown_reward("so 49 + 55 - 53 = 51 works", 51, nums).acc == 1.0
    assert d1_countdown_reward("\\boxed{49 + 55}", 104, nums).acc == 0.0
    # Python arithmetic, as d1's eval: ** and // are operators there
    assert python_arithmetic("2 ** 3 // 3") == 2
    assert python_arithmetic("1 / 0") == float("inf")
    assert python_arithmetic("9 ** 999") == float("inf")  # huge powers refused (deviation)
    assert d1_countdown_reward("\\boxed{<answer>}", 1, [1]).acc == 0.0


def test_sudoku_rules_and_cell_weight() -> None:
    puzzle, solution = "4320004330100004", "4321124334122134"
    # d1's second regex: <answer> up to <|eot_id|> (no </answer> needed)
    r = d1_sudoku_reward("<answer>\n4321124334122134<|eot_id|>", solution, puzzle)
    assert (r.acc, r.weight) == (1.0, 8.0)  # 8 empty cells, all right
    # the puzzle copied back: 0 of 8 empty cells right
    assert d1_sudoku_reward("<answer>4320004330100004</answer>", solution, puzzle).acc == 0.0
    # a 16-digit word anywhere is the last resort; short answers are padded with 0
    assert d1_sudoku_reward("grid 4321124334122134 done", solution, puzzle).acc == 1.0
    assert d1_sudoku_reward("<answer>4321</answer>", solution, puzzle).acc == 1 / 8
    with pytest.raises(ValueError, match="16-character"):
        d1_sudoku_reward("x", "123", "123")


def test_registry_routes_d1_mode() -> None:
    assert score("gsm8k", "\\boxed{18}", "18", mode="d1") == 1.0
    assert score("countdown", "\\boxed{2*4-3}", "5", {"numbers": "[2, 3, 4]"}, mode="d1") == 1.0
    assert score("countdown", "\\boxed{2*4-3}", "5", {"numbers": "[2, 3, 4]"}) == 0.0
    with pytest.raises(ValueError, match="reward mode"):
        score("gsm8k", "x", "1", mode="nope")


def test_d1_parser_reproduced_on_shipped_generations() -> None:
    """d1's own parser's verdicts on 96 published LLaDA-8B-Instruct generations (12 files: four
    tasks x three lengths) are reproduced item by item by our d1 preset."""
    sample = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    tasks = set()
    for entry in sample["files"]:
        ours = score_d1_file(entry["file"], {"generations": entry["items"]}, preset="d1")
        assert list(ours.per_item) == entry["d1_per_item"], entry["file"]
        tasks.add((ours.data_source, ours.gen_length))
    assert len(tasks) == 12

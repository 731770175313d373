"""`ground_truth_problem` reads a row's ground truth as its reward will (issue #38 T10)."""

from __future__ import annotations

import pytest

from dllm_eval import DATASETS, ground_truth_problem, load_rows


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_shipped_row_passes(name: str) -> None:
    # the check refuses no row its reward reads: every shipped test set's rows pass it
    bad = [(r.index, p) for r in load_rows(name)
           if (p := ground_truth_problem(r.data_source, r.ground_truth, r.extra_info)) is not None]
    assert bad == []


@pytest.mark.parametrize(("source", "truth", "clause"), [
    ("mbpp", "assert f(1) == 2", "is not JSON"),
    ("mbpp", '"assert f(1) == 2"', "is JSON of another shape (str)"),
    ("mbpp", "[1, 2]", "is JSON of another shape (list)"),
    ("humanevalplus", "inputs = [[1]\n", "is not Python source"),
    ("lcbv5", "[1, 2]", "cannot be read as input/output tests"),
    ("countdown", "", "is not a number"),
])
def test_unreadable_ground_truths_are_named(source: str, truth: str, clause: str) -> None:
    problem = ground_truth_problem(source, truth, {})
    assert problem is not None and problem.startswith(clause)


def test_text_sources_accept_any_text() -> None:
    assert ground_truth_problem("gsm8k", "not json {", {}) is None
    assert ground_truth_problem("math500", "\\frac{1}{2}", None) is None

"""Every block-family algorithm that scores several noised copies of a sequence (BGPO, EBPO, CJ-GRPO, TraceRL:
whichever of `cases.ALGORITHMS` runs on block families) gets the same per-copy log-probs, old
values, loss and gradients from the shared-clean BD3LM layout ([x_0 ; x_t^1 ; ... ; x_t^k],
`trainer.bd3lm_layout=shared`) as from the doubled one, on tiny float64 SDAR and LLaDA2 models,
with every group in one pass, a few groups per pass, and one copy per pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from dllm_train import Scorer, evaluate
from dllm_train.packed_scoring import shares_clean_context
from dllm_train.passes import split, trace
from tests.dllm_algorithms.cases import ALGORITHMS, prepared_batch
from tests.dllm_algorithms.test_microbatch import _reference
from tests.tiny_rl import tiny_model

BLOCK_ALGORITHMS = sorted(n for n, a in ALGORITHMS.items() if "sdar" in a.families)
CASES = [(n, f) for n in BLOCK_ALGORITHMS for f in ("sdar", "llada2")]
BUDGETS = (0, 40, 1)  # every group in one pass; a few rows per pass; one copy (and its clean half) per pass


def test_the_block_algorithms_are_those_that_score_several_copies() -> None:
    assert BLOCK_ALGORITHMS == ["BGPO", "CJGRPO", "EBPO", "TraceRL"]


def _tokens(calls: list[Any], scorer: Scorer, budget: int) -> int:
    """Tokens the passes of `calls` run under `budget`, as priced."""
    total = 0
    for p in split(calls, scorer, budget):
        c = calls[p.call]
        clean = c.clean if c.clean is not None else c.targets
        cost = scorer.row_cost(c.noisy, c.attention, clean)[p.rows]
        shared = scorer.shared_tokens(c.noisy, c.attention, clean)[p.rows]
        total += int(cost.sum() - shared[1:].sum())
    return total


@pytest.mark.parametrize(("name", "family"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_shared_clean_layout_equals_the_doubled_layout(name: str, family: str) -> None:
    model = tiny_model(family, dtype=torch.float64)
    rl, prepared, advantages = prepared_batch(name, family, model, train_attention="sdpa", bd3lm_layout="doubled")
    alg = ALGORITHMS[name]
    doubled = rl.actor.scorer
    assert not doubled.shared_context
    shared = Scorer(model, attention="sdpa")

    def values(scorer: Any) -> torch.Tensor:
        return alg.values(scorer, prepared.batch, prepared.data, 0)

    # the copies of a sequence do share a clean half, and the budget counts fewer tokens for it
    calls = trace(values, shared)
    assert any(bool(shares_clean_context(c.attention, c.clean if c.clean is not None else c.targets).any())
               for c in calls)
    assert _tokens(calls, shared, 0) < _tokens(calls, doubled, 0)
    # per-copy log-probs (the raw scorer outputs) and the values (old / reference passes)
    model.eval()
    want_values, want_raw = evaluate(values, doubled, 0)
    for budget in BUDGETS:
        got_values, got_raw = evaluate(values, shared, budget)
        for a, b in zip(got_raw, want_raw):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_values, want_values, rtol=1e-6, atol=1e-6)
    # the update: loss and gradients of the doubled layout in one forward, then shared in passes
    want_loss, want = _reference(alg, rl, prepared, advantages)
    scale = max(float(g.abs().max()) for g in want.values())
    assert scale > 0
    state = copy.deepcopy(model.state_dict())
    rl.actor.scorer = shared
    for budget in BUDGETS:
        rl.actor.max_tokens = budget
        metrics = rl.actor._step(prepared, advantages, 0)
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        model.load_state_dict(state)  # undo the optimizer step
        assert got.keys() == want.keys()
        gap = max(float((got[k] - want[k]).abs().max()) for k in want)
        assert gap <= 1e-6 * scale, (budget, gap, scale)
        assert metrics["loss"] == pytest.approx(want_loss, rel=1e-6, abs=1e-9), budget

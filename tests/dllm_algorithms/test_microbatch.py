"""Token-budget passes: for every algorithm, the loss and gradients of the update equal those of
one forward over the whole batch (float64 tiny models), whatever the budget, down to one row per
pass; the old and reference passes give the same values in passes as in one forward."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import dllm_algorithms as da
from dllm_train import LossInputs, RLAlgorithm, evaluate
from tests.dllm_algorithms.cases import ALGORITHMS, IDS, PAIRS, prepared_batch
from tests.tiny_rl import tiny_model

BUDGETS = (1, 23, 0)  # 1 token: every row in its own pass; 23: a few rows per pass; 0: no limit


def _reference(alg: RLAlgorithm[Any], rl: Any, prepared: Any, advantages: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of iteration 0 computed the plain way: one forward, autograd, one backward."""
    model, scorer = rl.actor.model, rl.actor.scorer
    model.train()
    model.zero_grad(set_to_none=True)
    values = alg.values(scorer, prepared.batch, prepared.data, 0)
    old = prepared.old[0] if prepared.old is not None else (values.detach() if alg.needs_old else None)
    ref = prepared.ref[0] if prepared.ref is not None else None
    loss, _ = alg.loss(values, LossInputs(batch=prepared.batch, data=prepared.data, iteration=0,
                                          advantages=advantages, old=old, ref=ref))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize(("name", "family"), PAIRS, ids=IDS)
def test_update_in_token_budget_passes_equals_the_single_batch_update(name: str, family: str) -> None:
    model = tiny_model(family, dtype=torch.float64)
    rl, prepared, advantages = prepared_batch(name, family, model)
    alg = ALGORITHMS[name]
    want_loss, want = _reference(alg, rl, prepared, advantages)
    assert want and max(float(g.abs().max()) for g in want.values()) > 0, "the reference gradient is zero"
    state = copy.deepcopy(model.state_dict())
    passes = []
    for budget in BUDGETS:
        rl.actor.max_tokens = budget
        metrics = rl.actor._step(prepared, advantages, 0)
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        model.load_state_dict(state)  # undo the optimizer step
        assert got.keys() == want.keys()
        scale = max(float(g.abs().max()) for g in want.values())
        gap = max(float((got[k] - want[k]).abs().max()) for k in want)
        assert gap <= 1e-6 * scale, (budget, gap, scale)
        assert metrics["loss"] == pytest.approx(want_loss, rel=1e-6, abs=1e-9), budget
        passes.append(metrics["update_passes"])
    assert passes[0] > passes[-1], passes  # the small budgets did split the passes


@pytest.mark.parametrize(("name", "family"), PAIRS, ids=IDS)
def test_old_values_in_passes_equal_one_forward(name: str, family: str) -> None:
    model = tiny_model(family, dtype=torch.float64)
    rl, prepared, _ = prepared_batch(name, family, model)
    alg = ALGORITHMS[name]

    def values(scorer: Any) -> torch.Tensor:
        return alg.values(scorer, prepared.batch, prepared.data, 0)

    model.eval()
    with torch.no_grad():
        whole = values(rl.actor.scorer)
    for budget in (1, 23):
        got, _ = evaluate(values, rl.actor.scorer, budget)
        assert torch.allclose(got, whole, rtol=1e-9, atol=1e-12), budget


def test_every_algorithm_of_the_library_is_covered() -> None:
    classes = {n for n in da.__all__ if isinstance(getattr(da, n), type) and issubclass(getattr(da, n), RLAlgorithm)}
    assert classes == set(ALGORITHMS)

"""Activation checkpointing sized to memory (`dllm_models.activation_memory`).

The rule worked by hand; on a tiny float64 SDAR of 4 layers (CPU: the measured bytes are those
autograd saves), gradients with any budget equal those of full checkpointing and of none, and the
number of checkpointed layers is the smallest that fits the budget: every layer with none to
size against, fewer as the budget grows, none with room for all.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_models import ActivationBudget, ActivationPlanner, build_model
from dllm_models.activation_memory import layers_to_checkpoint
from tests.dllm_models.tiny_configs import TINY_CONFIGS
from tests.tiny_rl import special_ids


def test_layers_to_checkpoint_by_hand() -> None:
    # L = 4 layers of A = 10 bytes, a checkpointed one keeps K = 1, plus one recompute (A) if c > 0:
    # c = 0: 4 * 10 = 40; c = 1: 3 * 10 + 1 + 10 = 41; c = 2: 20 + 2 + 10 = 32; c = 4: 0 + 4 + 10 = 14
    assert layers_to_checkpoint(4, 10, 1, 40) == 0
    assert layers_to_checkpoint(4, 10, 1, 39) == 2
    assert layers_to_checkpoint(4, 10, 1, 32) == 2
    assert layers_to_checkpoint(4, 10, 1, 31) == 3   # c = 3: 10 + 3 + 10 = 23
    assert layers_to_checkpoint(4, 10, 1, 13) == 4   # none fits: every layer
    assert layers_to_checkpoint(0, 10, 1, 0) == 0


def test_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        ActivationBudget(budget_bytes=-1)
    with pytest.raises(ValueError, match="reserve_bytes"):
        ActivationBudget(reserve_bytes=-1)
    with pytest.raises(ValueError, match="min_measure_tokens"):
        ActivationBudget(min_measure_tokens=0)
    assert ActivationBudget().limit(torch.device("cpu")) is None


def _model() -> Any:
    raw = TINY_CONFIGS["sdar"](**special_ids())
    raw["num_hidden_layers"] = 4
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)
    model = model.to(torch.float64)
    model.train()
    model.gradient_checkpointing = True
    return model


def _grads(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    logits = model(ids).logits
    (logits.double().log_softmax(-1)[..., 3].sum()).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_gradients_equal_full_checkpointing_and_the_count_follows_the_budget() -> None:
    model = _model()
    ids = torch.randint(0, 12, (2, 24), generator=torch.Generator().manual_seed(1))
    model.activation_planner = None
    full = _grads(model, ids)  # every layer checkpointed (no planner)
    model.gradient_checkpointing = False
    plain = _grads(model, ids)
    model.gradient_checkpointing = True
    for a, b in zip(full, plain):
        assert torch.allclose(a, b, rtol=0, atol=1e-14)

    # no budget to size against on the CPU: every layer
    unsized = ActivationPlanner(ActivationBudget(budget_bytes=None, reserve_bytes=0))
    model.activation_planner = unsized
    _grads(model, ids)
    assert unsized.last_checkpointed == 4 and unsized.bytes_per_token is None

    planner = ActivationPlanner(ActivationBudget(budget_bytes=0, reserve_bytes=0, min_measure_tokens=48))
    model.activation_planner = planner
    small = torch.randint(0, 12, (1, 20), generator=torch.Generator().manual_seed(2))
    for a, b in zip(_grads(model, small), _grads(model, small)):  # too few tokens to measure: every layer
        assert torch.equal(a, b)
    assert planner.bytes_per_token is None and planner.last_checkpointed == 4
    with torch.no_grad():  # an old-values pass saves nothing: no layer measured or checkpointed
        model(ids)
    assert planner.bytes_per_token is None and planner.last_checkpointed == 4  # still the last training forward's
    first = _grads(model, ids)  # the first forward measures its first layer, checkpoints the rest
    assert planner.last_checkpointed == 3 and planner.bytes_per_token is not None and planner.bytes_per_token > 0
    tokens = ids.numel()
    per_layer = planner.bytes_per_token * tokens
    kept = tokens * model.config.hidden_size * 8  # a checkpointed layer keeps its float64 input
    assert per_layer > 4 * kept  # a layer saves far more than its input
    for a, b in zip(first, full):
        assert torch.allclose(a, b, rtol=0, atol=1e-14)
    counts = []
    for budget in (0, per_layer + 3 * kept, 2 * per_layer + 2 * kept, 3 * per_layer + kept, 4 * per_layer):
        planner = ActivationPlanner(ActivationBudget(budget_bytes=int(budget), reserve_bytes=0, min_measure_tokens=1))
        planner.bytes_per_token = per_layer / tokens
        model.activation_planner = planner
        grads = _grads(model, ids)
        for a, b in zip(grads, full):
            assert torch.allclose(a, b, rtol=0, atol=1e-14)
        counts.append(planner.last_checkpointed)
    # the smallest c with (4 - c) * A + c * K <= budget: 4, 3, 2, 1, 0 checkpointed layers
    assert counts == [4, 3, 2, 1, 0], counts

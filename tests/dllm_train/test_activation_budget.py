"""`trainer.activation_memory_gib`: validated, and it reaches the policy's checkpointing planner
(`dllm_models.ActivationPlanner`) when `trainer.activation_checkpointing` is on; one RL step with
a budget runs and the planner sizes its training forwards (CPU: bytes measured, budget in GiB)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_models import ActivationPlanner
from dllm_models.activation_memory import GIB
from dllm_train import TrainerConfig, set_activation_checkpointing
from tests.dllm_algorithms.cases import ALGORITHMS
from tests.tiny_rl import fast, local_rl, tiny_model


def test_the_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="activation_memory_gib"):
        TrainerConfig(activation_memory_gib=-1.0)
    assert TrainerConfig().activation_memory_gib == 0.0


def test_set_activation_checkpointing_sizes_to_the_budget() -> None:
    model = tiny_model("sdar")
    set_activation_checkpointing(model, True, memory_gib=76)
    assert model.gradient_checkpointing and isinstance(model.activation_planner, ActivationPlanner)
    assert model.activation_planner.budget.budget_bytes == 76 * GIB
    set_activation_checkpointing(model, True, memory_gib=0)  # the device's memory
    assert model.activation_planner.budget.budget_bytes is None
    set_activation_checkpointing(model, True)  # no budget: every layer, as before
    assert model.activation_planner is None
    set_activation_checkpointing(model, False, memory_gib=76)
    assert not model.gradient_checkpointing and model.activation_planner is None


def test_an_rl_step_with_a_budget_sizes_its_training_forwards() -> None:
    model = tiny_model("sdar")
    rl = local_rl(model, fast(ALGORITHMS["BGPO"]), activation_checkpointing=True, activation_memory_gib=8.0,
                  train_attention="sdpa")
    planner = model.activation_planner
    assert isinstance(planner, ActivationPlanner) and planner.budget.budget_bytes == 8 * GIB
    # the tiny step's packed forwards hold ~160 tokens (noisy copies carry only their noised
    # blocks): let forwards of that size measure a layer
    planner.budget = dataclasses.replace(planner.budget, min_measure_tokens=64)
    before = [p.detach().clone() for p in model.parameters()]
    rl.step(0)
    assert planner.bytes_per_token is not None and planner.bytes_per_token > 0  # measured in a training forward
    # a tiny model's passes fit 8 GiB less the 4 GiB reserve: no layer recomputed
    assert planner.last_checkpointed == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

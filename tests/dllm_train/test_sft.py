"""SFT on every family (MDLM and BDLM layouts) lowers the loss; adapter-only weight hand-off."""

from __future__ import annotations

import copy

import pytest
import torch

from dare.algorithms import SFT
from dllm_train import OptimConfig, RolloutWorker, derive_seed
from dllm_rollout import SamplingConfig
from tests.dllm_train.algo_helpers import FAMILIES, TASK, tiny_model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_step_trains_every_family(family: str) -> None:
    model = tiny_model(family)
    worker = SFT().worker(model, lambda s: TASK.sft_batch(16, derive_seed(0, "sft", 0)), OptimConfig(lr=3e-3),
                          steps=8, batch_size=16, seed=0)
    with torch.no_grad():
        first = float(worker.loss(0))  # same batch and masks before and after training
    for s in range(8):
        worker.step(s)
    with torch.no_grad():
        assert float(worker.loss(0)) < first


def test_adapter_only_handoff_updates_only_trainable_weights() -> None:
    policy = tiny_model("llada")
    rollout_model = copy.deepcopy(policy)
    names = [n for n, _ in policy.named_parameters()]
    for n, p in policy.named_parameters():
        p.requires_grad_(n == names[-1])
    from dllm_train import ActorWorker

    actor = ActorWorker(policy, object(), OptimConfig())  # type: ignore[arg-type]
    with torch.no_grad():
        dict(policy.named_parameters())[names[-1]].add_(1.0)
    state = actor.adapter_state()
    assert list(state) == [names[-1]]
    RolloutWorker(rollout_model, SamplingConfig(max_new_tokens=4, steps=4, block_length=4)).load_weights(state)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), rollout_model.state_dict().values()))


def test_lora_sft_trains_adapters_only() -> None:
    pytest.importorskip("peft")
    from dare.algorithms import LoRA

    model = tiny_model("llada")
    worker = SFT(lora=LoRA(rank=4, alpha=8)).worker(
        model, lambda s: TASK.sft_batch(8, s), OptimConfig(lr=1e-2), steps=2, batch_size=8, seed=0)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    worker.step(0)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)

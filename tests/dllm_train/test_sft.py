"""SFT on every family (MDLM and BDLM layouts) lowers the loss; adapter-only weight hand-off."""

from __future__ import annotations

import copy

import pytest
import torch

from dllm_algorithms import D1, SFT, LoRA
from dllm_rollout import SamplingConfig
from dllm_train import OptimConfig, RolloutWorker, derive_seed
from tests.dllm_train.helpers import sft_batch
from tests.tiny_rl import FAMILIES, tiny_model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_step_trains_every_family(family: str) -> None:
    model = tiny_model(family)
    worker = SFT().worker(model, lambda s: sft_batch(16, derive_seed(0, "sft", 0)), OptimConfig(lr=3e-3),
                          steps=8, seed=0)
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

    actor = ActorWorker(policy, D1(), OptimConfig())
    with torch.no_grad():
        dict(policy.named_parameters())[names[-1]].add_(1.0)
    state = actor.adapter_state()
    assert list(state) == [names[-1]]
    RolloutWorker(rollout_model, SamplingConfig(max_new_tokens=4, steps=4, block_length=4)).load_weights(state)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), rollout_model.state_dict().values()))


def test_lora_sft_trains_adapters_only() -> None:
    pytest.importorskip("peft")

    model = tiny_model("llada")
    worker = SFT(lora=LoRA(rank=4, alpha=8)).worker(
        model, lambda s: sft_batch(8, s), OptimConfig(lr=1e-2), steps=2, seed=0)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    worker.step(0)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_sft_token_budget_gives_the_single_batch_loss_and_gradient(family: str) -> None:
    # float64 model: one row per forward (12 tokens; an SDAR row with several noised blocks costs more
    # and gets a pass of its own) accumulates exactly the gradient of the whole batch at once
    def run(budget: int) -> tuple[dict[str, float], list[torch.Tensor]]:
        model = tiny_model(family, dtype=torch.float64)
        worker = SFT().worker(model, lambda s: sft_batch(4, s), OptimConfig(lr=1e-3, grad_clip=0.0), steps=1,
                              seed=0, max_tokens_per_pass=budget)
        metrics = worker.step(0)
        return metrics, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (whole, g_whole), (split, g_split) = run(0), run(12)
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-6, abs=1e-9)
    # (the families normalise and rotate in float32 inside a float64 model: relative 1e-6, as in
    # tests/dllm_algorithms/test_microbatch.py)
    assert g_whole and len(g_whole) == len(g_split)
    scale = max(float(g.abs().max()) for g in g_whole)
    assert scale > 0 and max(float((a - b).abs().max()) for a, b in zip(g_whole, g_split)) <= 1e-6 * scale


def test_sft_step_reports_the_device_memory_peak_only_on_cuda() -> None:
    # every training step (RL, SFT, preference) reports `peak_gib` on CUDA: the H200 runs read it
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = tiny_model("llada").to(device)

    def batch(step: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(device) for t in sft_batch(4, derive_seed(0, "sft", step)))

    worker = SFT().worker(model, batch, OptimConfig(lr=1e-3), steps=1, seed=0)
    metrics = worker.step(0)
    if device.type == "cuda":
        assert 0 < metrics["peak_gib"] < torch.cuda.get_device_properties(0).total_memory / 2**30
    else:
        assert "peak_gib" not in metrics

"""DPO / VRPO: loss log 2 at the reference with shared masks, and a step trains."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dllm_algorithms import DPO, VRPO
from dllm_train import OptimConfig, PreferenceWorker
from tests.dllm_train.helpers import preference_pairs
from tests.tiny_rl import tiny_model

ALGORITHMS = {"dpo": DPO(), "vrpo": VRPO()}


@pytest.mark.parametrize(("name", "family"), [("dpo", "llada"), ("vrpo", "llada"), ("vrpo", "dream")])
def test_preference_step(name: str, family: str) -> None:
    model = tiny_model(family)
    worker = PreferenceWorker(model, copy.deepcopy(model), preference_pairs, ALGORITHMS[name].build(),
                              OptimConfig(lr=1e-3), seed=0)
    if name == "vrpo":
        pc, pr, rc, rr = worker.values(0)
        assert torch.allclose(pc - pr, rc - rr, atol=1e-5)  # shared masks: logit exactly 0
    before = [p.detach().clone() for p in model.parameters()]
    m = worker.step(0)
    if name == "vrpo":
        assert abs(m["loss"] - math.log(2)) < 1e-4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("name", ["dpo", "vrpo"])
def test_preference_token_budget_gives_the_single_batch_loss_and_gradient(name: str) -> None:
    # float64; the DPO margin couples a pair's sides (values first, then passes backpropagating
    # dL/dv): one row per forward gives the whole batch's loss and gradient
    def run(budget: int) -> tuple[dict[str, float], list[torch.Tensor]]:
        model = tiny_model("llada", dtype=torch.float64)
        worker = PreferenceWorker(model, copy.deepcopy(model), lambda s: preference_pairs(s, count=4),
                                  ALGORITHMS[name].build(), OptimConfig(lr=1e-3, grad_clip=0.0), seed=0,
                                  max_tokens_per_pass=budget)
        metrics = worker.step(0)
        return metrics, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (whole, g_whole), (split, g_split) = run(0), run(12)
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-6, abs=1e-9)
    assert split["reward_margin"] == pytest.approx(whole["reward_margin"], rel=1e-6, abs=1e-9)
    # (the families normalise and rotate in float32 inside a float64 model: relative 1e-6, as in
    # tests/dllm_algorithms/test_microbatch.py)
    assert g_whole and len(g_whole) == len(g_split)
    scale = max(float(g.abs().max()) for g in g_whole)
    assert scale > 0 and max(float((a - b).abs().max()) for a, b in zip(g_whole, g_split)) <= 1e-6 * scale

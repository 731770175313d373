"""DPO / VRPO: loss log 2 at the reference with shared masks, and a step trains; a preference loss
defined in this file trains through the same worker."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch

from dllm_algorithms import DPO, VRPO, ELBOPreference, PairMasks, PreferenceBatch
from dllm_objectives import MaskPlan, iid_masks
from dllm_train import OfflineInputs, OfflineWorker, OptimConfig
from tests.dllm_train.helpers import preference_pairs
from tests.tiny_rl import tiny_model

ALGORITHMS = {"dpo": DPO(), "vrpo": VRPO()}


@pytest.mark.parametrize(("name", "family"), [("dpo", "llada"), ("vrpo", "llada"), ("vrpo", "dream")])
def test_preference_step(name: str, family: str) -> None:
    model = tiny_model(family)
    worker = OfflineWorker(model, ALGORITHMS[name], preference_pairs, OptimConfig(lr=1e-3), seed=0,
                           ref_model=copy.deepcopy(model))
    if name == "vrpo":
        (pc, pr), (rc, rr) = worker.values(0)
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
        worker = OfflineWorker(model, ALGORITHMS[name], lambda s: preference_pairs(s, count=4),
                               OptimConfig(lr=1e-3, grad_clip=0.0), seed=0, ref_model=copy.deepcopy(model),
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


@dataclass(frozen=True)
class IPO(ELBOPreference):
    """IPO (Azar et al., arXiv 2310.12036) on ELBOs, defined here, outside dllm_train and dllm_algorithms:
    the squared distance of the margin h = (pi_w - ref_w) - (pi_l - ref_l) to 1 / (2 tau)."""

    tau: float = 0.5
    mc_num: int = 2

    def sample_plan(self, valid: torch.Tensor, generator: torch.Generator) -> MaskPlan:
        return iid_masks(valid, self.mc_num, eps=1e-3, generator=generator)

    def loss(self, values: torch.Tensor, inputs: OfflineInputs[PreferenceBatch, PairMasks]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        assert inputs.ref is not None
        h = (values[0] - inputs.ref[0]) - (values[1] - inputs.ref[1])
        return ((h - 1 / (2 * self.tau)) ** 2).mean(), {"margin": h.detach().mean()}


def test_a_preference_loss_defined_outside_the_trainer_trains_through_its_worker() -> None:
    model = tiny_model("llada")
    worker = OfflineWorker(model, IPO(), preference_pairs, OptimConfig(lr=1e-2), seed=0, ref_model=copy.deepcopy(model))
    pol, ref = worker.values(0)
    assert ref is not None and pol.shape == ref.shape == (2, 8)
    assert torch.allclose(pol, ref)  # the reference is the initial policy, on the same (shared) masks
    before = [p.detach().clone() for p in model.parameters()]
    m = worker.step(0)
    # h = 0 for every pair: loss (0 - 1 / (2 * 0.5))^2 = 1
    assert m["loss"] == pytest.approx(1.0, abs=1e-5) and m["margin"] == pytest.approx(0.0, abs=1e-5)
    assert m["optimizer_steps"] == 1.0 and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    pol, ref = worker.values(1)  # the policy has moved: the reported loss is IPO's on the worker's values
    assert ref is not None
    h = (pol[0] - ref[0]) - (pol[1] - ref[1])
    assert float(h.abs().max()) > 0
    m = worker.step(1)
    assert m["loss"] == pytest.approx(float(((h - 1.0) ** 2).mean()), rel=1e-5)
    assert m["margin"] == pytest.approx(float(h.mean()), rel=1e-4, abs=1e-7)

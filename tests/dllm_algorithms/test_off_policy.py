"""SPG and DMPO with several optimizer steps per rollout batch (`num_iterations`): the second
step is off-policy (the policy moved, its masks are new), yet the trainer's loss and gradient are
exactly the algorithm's formula on the current policy: no ratio, no clip (as in the papers)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import dllm_algorithms as da
from dllm_objectives import dmpo_sequence_elbo, spg_loss, spg_sequence_logp, wdce_loss
from dllm_train import LossInputs, Scorer, plan_token_logp, sequence_inputs
from tests.dllm_algorithms.cases import prepared_batch
from tests.tiny_rl import tiny_model

CLIP = 0.2  # a typical clip range, which these losses ignore


@dataclass(frozen=True, kw_only=True)
class RecordingSPG(da.SPG):
    records: list[dict[str, Any]] = field(default_factory=list)

    def loss(self, values: torch.Tensor, inputs: LossInputs[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return _record(self.records, inputs, super().loss(values, inputs))


@dataclass(frozen=True, kw_only=True)
class RecordingDMPO(da.DMPO):
    records: list[dict[str, Any]] = field(default_factory=list)

    def loss(self, values: torch.Tensor, inputs: LossInputs[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return _record(self.records, inputs, super().loss(values, inputs))


_MODEL: list[Any] = []


def _record(records: list[dict[str, Any]], inputs: LossInputs[Any], out: Any) -> Any:
    if not torch.is_grad_enabled():  # the trainer's final evaluation of the step's loss
        records.append({"iteration": inputs.iteration, "loss": float(out[0]),
                        "weights": copy.deepcopy(_MODEL[0].state_dict())})
    return out


def _direct(alg: Any, model: Any, batch: Any, plan: Any, advantages: torch.Tensor,
            weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sequence estimate [B]) of `model` on `plan`, straight from dllm_objectives."""
    r = batch.rollout
    ids, attn, _, response_valid = sequence_inputs(r)
    lp = plan_token_logp(Scorer(model), ids, attn, plan)
    if isinstance(alg, da.SPG):
        value = spg_sequence_logp(lp, plan, response_valid, advantages > 0, negative=alg.negative,
                                  eubo_beta=alg.eubo_beta, mix_weight=alg.mix_weight)
        return spg_loss(value, advantages, r.response_mask.sum(-1)), value
    assert weights is not None
    return wdce_loss(lp, plan.mask, weights), dmpo_sequence_elbo(lp, plan.mask, response_valid)


def _two_updates(name: str) -> dict[str, Any]:
    alg: Any = RecordingSPG(num_iterations=2) if name == "SPG" else RecordingDMPO(num_iterations=2, mc_num=2)
    model = tiny_model("llada")
    _MODEL[:] = [model]
    from tests.dllm_algorithms import cases

    saved = cases.ALGORITHMS[name]
    cases.ALGORITHMS[name] = alg
    try:
        rl, prepared, advantages = prepared_batch(name, "llada", model)
    finally:
        cases.ALGORITHMS[name] = saved
    for group in rl.actor.optimizer.param_groups:
        group["lr"] = 5e-2
    rl.actor.optim.cfg = dataclasses.replace(rl.actor.optim.cfg, lr=5e-2)  # the schedule reads this
    metrics = rl.actor.update(prepared, advantages)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    records = alg.records
    behaviour, second = copy.deepcopy(model), copy.deepcopy(model)
    behaviour.load_state_dict(records[0]["weights"])  # the rollout policy
    second.load_state_dict(records[1]["weights"])  # the policy at the second update
    plans = prepared.data if name == "SPG" else prepared.data.plans
    weights = None if name == "SPG" else prepared.data.weights
    with torch.no_grad():
        _, old_value = _direct(alg, behaviour, prepared.batch, plans[1], advantages, weights)
    second.zero_grad()
    loss, new_value = _direct(alg, second, prepared.batch, plans[1], advantages, weights)
    loss.backward()
    direct = {n: p.grad for n, p in second.named_parameters() if p.grad is not None}
    return {
        "iterations": [r["iteration"] for r in records], "reported": metrics["loss"],
        "trainer_loss": records[1]["loss"], "direct_loss": float(loss.detach()),
        "ratio": torch.exp(new_value.detach() - old_value),
        "plans_differ": not torch.equal(plans[0].mask, plans[1].mask),
        "grad_err": max(float((grads[n] - direct[n]).abs().max()) for n in direct),
        "grad_scale": max(float(t.abs().max()) for t in direct.values()),
    }


@pytest.fixture(scope="module", params=["SPG", "DMPO"])
def run(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, _two_updates(request.param)


def test_second_inner_update_is_off_policy(run: tuple[str, dict[str, Any]]) -> None:
    name, r = run
    assert r["iterations"] == [0, 1], r["iterations"]  # one final loss per inner update
    assert r["plans_differ"]  # each inner update draws its own masks
    assert float((r["ratio"] - 1).abs().max()) > 1e-3, (name, r["ratio"])


def test_trainer_loss_equals_the_objective_formula(run: tuple[str, dict[str, Any]]) -> None:
    name, r = run
    assert r["reported"] == pytest.approx(r["trainer_loss"])  # the metrics report the last inner update
    assert r["trainer_loss"] == pytest.approx(r["direct_loss"], rel=1e-5, abs=1e-7), name
    assert r["trainer_loss"] != 0.0


def test_nothing_clips_a_policy_moved_beyond_the_clip_range(run: tuple[str, dict[str, Any]]) -> None:
    name, r = run
    outside = ((r["ratio"] < 1 - CLIP) | (r["ratio"] > 1 + CLIP)).sum()
    assert int(outside) > 0, (name, r["ratio"])
    assert r["grad_scale"] > 1e-4, r
    assert r["grad_err"] < 1e-5 * r["grad_scale"], (name, r["grad_err"], r["grad_scale"])

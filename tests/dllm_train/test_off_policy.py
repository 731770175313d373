"""SPG and DMPO off-policy: two optimizer steps per rollout batch (`num_iterations=2`).

Neither algorithm has an importance ratio or a clip in its loss (spec §2.5: SPG is REINFORCE on
ELBO/EUBO sequence estimates; §2.12: DMPO's weights are fixed at rollout time). So the second
update is off-policy, and these tests pin down what it then computes: the policy has moved
(new/old ratio of the sequence estimates != 1), the trainer's loss equals the dllm_objectives
formula on the same masks and log-probs, and nothing clips it: far beyond any clip range, its
gradient is still the unclipped formula's gradient.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch

from dare.algorithms import get_algorithm
from dllm_objectives import (
    dmpo_baseline,
    dmpo_sequence_elbo,
    dmpo_weights,
    spg_loss,
    spg_sequence_logp,
    wdce_loss,
)
from dllm_train import ActorWorker, Experience, OptimConfig, Scorer, generator, plan_token_logp, sample_seeds
from dllm_train import sequence_inputs
from tests.dllm_train.algo_helpers import tiny_model, workflow

CLIP = 0.2  # the run's clip range (RLConfig.clip_low / clip_high), which these losses ignore


def _direct(name: str, entry: Any, model: Any, exp: Experience, plan: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sequence estimate [B]) of `model` on `plan`, straight from dllm_objectives."""
    r = exp.rollout
    ids, attn, _, response_valid = sequence_inputs(r)
    lp = plan_token_logp(Scorer(model), ids, attn, plan)
    assert exp.advantages is not None
    if name == "spg":
        value = spg_sequence_logp(lp, plan, response_valid, exp.advantages > 0, negative=entry.negative,
                                  eubo_beta=entry.eubo_beta, mix_weight=entry.mix_weight)
        return spg_loss(value, exp.advantages, r.response_mask.sum(-1)), value
    assert r.step_logp is not None and r.ref_step_logp is not None
    log_rnd = ((r.ref_step_logp - r.step_logp) * r.response_mask).sum(-1)
    w, w_neg = dmpo_weights(exp.scores, log_rnd, exp.group_ids, alpha=entry.alpha, coeff=entry.coeff)
    weights = dmpo_baseline(w, exp.group_ids, kind=entry.baseline, neg_weights=w_neg)
    return wdce_loss(lp, plan.mask, weights), dmpo_sequence_elbo(lp, plan.mask, response_valid)


def _two_updates(name: str, fields: dict[str, Any], lr: float) -> dict[str, Any]:
    entry = dataclasses.replace(get_algorithm(name), num_iterations=2, **fields)  # type: ignore[type-var]
    model = tiny_model("llada")
    wf = workflow(model, name, algorithm=entry)
    records: list[dict[str, Any]] = []
    inner = wf.objective.loss

    def recording_loss(values: torch.Tensor, old: Any, adv: torch.Tensor, exp: Experience) -> Any:
        out = inner(values, old, adv, exp)
        records.append({"iteration": exp.iteration, "loss": float(out[0].detach()),
                        "weights": copy.deepcopy(model.state_dict())})
        return out

    objective = dataclasses.replace(wf.objective, loss=recording_loss)
    actor = ActorWorker(model, objective, OptimConfig(lr=lr, grad_clip=0.0))  # p.grad stays unclipped
    prompts, answers, groups = wf.prompts(0).expanded()
    rollout = wf.rollout.generate(prompts, sample_seeds(0, len(prompts), "rollout", 0))
    g = torch.Generator().manual_seed(5)
    # rewards and advantages with signal (an untrained tiny model's rewards are all equal)
    exp = Experience(rollout=rollout, scores=torch.rand(len(prompts), generator=g), group_ids=groups)
    actor.prepare(exp, generator(0, "plan", 0))
    exp.advantages = torch.randn(len(prompts), generator=g)
    metrics = actor.update(exp)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    behaviour, second = copy.deepcopy(model), copy.deepcopy(model)
    behaviour.load_state_dict(records[0]["weights"])  # the rollout policy
    second.load_state_dict(records[1]["weights"])  # the policy at the second update
    plan = exp.plan[1]
    with torch.no_grad():
        _, old_value = _direct(name, entry, behaviour, exp, plan)
    second.zero_grad()
    loss, new_value = _direct(name, entry, second, exp, plan)
    loss.backward()
    direct_grads = {n: p.grad for n, p in second.named_parameters() if p.grad is not None}
    return {
        "iterations": [r["iteration"] for r in records], "reported": metrics["loss"],
        "trainer_loss": records[1]["loss"], "direct_loss": float(loss.detach()),
        "ratio": torch.exp(new_value.detach() - old_value), "plans_differ": not torch.equal(exp.plan[0].mask,
                                                                                              plan.mask),
        "grad_err": max(float((grads[n] - direct_grads[n]).abs().max()) for n in direct_grads),
        "grad_scale": max(float(t.abs().max()) for t in direct_grads.values()),
    }


CASES = {"spg": {}, "dmpo": {"num_replicates": 2}}


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    name = request.param
    return name, _two_updates(name, CASES[name], lr=5e-2)


def test_second_inner_update_is_off_policy(run: tuple[str, dict[str, Any]]) -> None:
    name, r = run
    assert r["iterations"] == [0, 1], r["iterations"]  # one loss per inner update
    assert r["plans_differ"]  # each inner update draws its own masks
    assert float((r["ratio"] - 1).abs().max()) > 1e-3, (name, r["ratio"])


def test_trainer_loss_equals_the_objective_formula(run: tuple[str, dict[str, Any]]) -> None:
    name, r = run
    assert r["reported"] == r["trainer_loss"]  # the metrics report the last inner update
    assert r["trainer_loss"] == pytest.approx(r["direct_loss"], rel=1e-5, abs=1e-7), name
    assert r["trainer_loss"] != 0.0


def test_nothing_clips_a_policy_moved_beyond_the_clip_range(run: tuple[str, dict[str, Any]]) -> None:
    # some sequences' ratio left [1 - eps, 1 + eps]; a clipped surrogate would have zeroed their
    # gradient, but these losses have no clip: the step's gradient is the unclipped formula's
    name, r = run
    outside = ((r["ratio"] < 1 - CLIP) | (r["ratio"] > 1 + CLIP)).sum()
    assert int(outside) > 0, (name, r["ratio"])
    assert r["grad_scale"] > 1e-4, r
    assert r["grad_err"] < 1e-5 * r["grad_scale"], (name, r["grad_err"], r["grad_scale"])

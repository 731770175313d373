"""`ActorWorker(reuse_old=True)`: the old pass is skipped only where the training forward is it.

On-policy with one update per batch and the default update, the old values are the objective's
values under the rollout policy on the same masks, which is exactly what the training forward
computes before the weights move. Skipping the separate pass must change nothing: same loss,
same gradients, same metrics; one scoring pass fewer.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch

from dllm_train import ActorWorker, Experience, OptimConfig, generator, sample_seeds
from tests.dllm_train.algo_helpers import tiny_model, workflow


def _step(name: str, reuse: bool, entry: Any = None) -> tuple[dict[str, float], dict[str, torch.Tensor], int]:
    model = tiny_model("llada")
    wf = workflow(model, name, algorithm=entry)
    calls = [0]
    inner = wf.objective.score

    def counting(scorer: Any, exp: Experience) -> torch.Tensor:
        calls[0] += 1
        return inner(scorer, exp)

    objective = dataclasses.replace(wf.objective, score=counting)
    actor = ActorWorker(model, objective, OptimConfig(lr=1e-3, grad_clip=0.0), reuse_old=reuse)
    prompts, _, groups = wf.prompts(0).expanded()
    rollout = wf.rollout.generate(prompts, sample_seeds(0, len(prompts), "rollout", 0))
    g = torch.Generator().manual_seed(5)
    exp = Experience(rollout=rollout, scores=torch.rand(len(prompts), generator=g), group_ids=groups)
    actor.prepare(exp, generator(0, "plan", 0))
    exp.advantages = torch.randn(len(prompts), generator=g)
    before = copy.deepcopy(model.state_dict())
    metrics = actor.update(exp)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert any(not torch.equal(before[n], p) for n, p in model.state_dict().items())
    return metrics, grads, calls[0]


@pytest.mark.parametrize("name", ["d1", "coupled-grpo"])
def test_skipping_the_old_pass_changes_nothing(name: str) -> None:
    m_ref, g_ref, calls_ref = _step(name, reuse=False)
    m, g, calls = _step(name, reuse=True)
    assert (calls_ref, calls) == (2, 1)
    assert m["loss"] == pytest.approx(m_ref["loss"], rel=1e-6, abs=1e-7)
    for key in ("clip_frac", "ppo_kl"):
        if key in m_ref:
            assert m[key] == pytest.approx(m_ref[key], abs=1e-6)
    assert g.keys() == g_ref.keys() and g
    for n in g:
        torch.testing.assert_close(g[n], g_ref[n], rtol=1e-5, atol=1e-7)


def test_old_pass_kept_where_the_policy_moves_or_the_update_is_custom() -> None:
    obj = workflow(tiny_model("llada"), "d1").objective
    optim = OptimConfig(lr=1e-3)
    model = tiny_model("llada")
    assert ActorWorker(model, obj, optim).old_from_training_pass
    assert not ActorWorker(model, obj, optim, reuse_old=False).old_from_training_pass
    # a second update per batch runs after the weights moved: its old values need their own pass
    assert not ActorWorker(model, dataclasses.replace(obj, num_iterations=2), optim).old_from_training_pass
    # a custom update may read the old values before any forward (chunked backward)
    custom = dataclasses.replace(obj, update=lambda o, s, e: (torch.zeros(()), {}))
    assert not ActorWorker(model, custom, optim).old_from_training_pass
    assert not ActorWorker(model, dataclasses.replace(obj, needs_old=False), optim).old_from_training_pass

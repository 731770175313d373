"""The algorithm fields the Countdown ablations switch (docs/benchmarks.md, issue 26 item 7):
d1's and SPG's prompt masking rate, and DMPO's group baseline, on a real rollout."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import dllm_algorithms as da
from dllm_algorithms.scoring import inputs
from dllm_train import RLAlgorithm, sample_seeds
from tests.tiny_rl import addition_prompts, local_rl, text_reward, tiny_model


def prepared(alg: RLAlgorithm[Any], seed: int = 0) -> Any:
    """The rank's prepared batch after one rollout of `alg` (LLaDA, 2 prompts x 4 samples)."""
    rl = local_rl(tiny_model("llada"), alg, seed=seed, reward=text_reward)
    prompts, answers, groups = addition_prompts(2, 4, seed)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(seed, len(prompts), "rollout", 0), groups)
    assert rl.rank.prepared is not None
    return rl.rank.prepared


def plan_of(alg: RLAlgorithm[Any], data: Any) -> Any:
    return data[0] if isinstance(alg, da.SPG) else data


@pytest.mark.parametrize("make", [lambda **kw: da.D1(**kw), lambda **kw: da.SPG(mc_num=4, **kw)], ids=["D1", "SPG"])
def test_prompt_mask_prob_zero_leaves_every_prompt_token_clean(make: Any) -> None:
    default, off = make(), make(prompt_mask_prob=0.0)
    assert default.prompt_mask_prob == 0.15  # the papers' rate stays the default
    p_on, p_off = prepared(default), prepared(off)
    prompt_valid, response_valid = inputs(p_on.batch)[2:]
    on, none = plan_of(default, p_on.data), plan_of(off, p_off.data)
    assert not (none.mask & prompt_valid[:, None]).any()
    assert (on.mask & prompt_valid[:, None]).any()  # the default masks some prompt tokens
    # the response's masks do not depend on the prompt's rate
    assert torch.equal(on.mask & response_valid[:, None], none.mask & response_valid[:, None])


def test_spg_rejects_a_prompt_mask_rate_outside_0_1() -> None:
    with pytest.raises(ValueError, match="algorithm.prompt_mask_prob must be in \\[0, 1\\], got 1.5"):
        da.SPG(prompt_mask_prob=1.5)


def test_dmpo_group_baseline_is_the_weights_minus_their_group_mean() -> None:
    # the reference's `advantage_centering` "group": w - mean(w) over the group, from w = softmax_g(rho + r / alpha)
    alg = da.DMPO(baseline="group", num_iterations=1)
    p = prepared(alg)
    r = p.batch.rollout
    log_rnd = ((r.ref_step_logp - r.step_logp) * r.response_mask).sum(-1).double()
    scores, groups = p.batch.scores.double(), p.batch.group_ids
    assert len(set(scores.tolist())) > 1  # the rewards differ, so the weights do
    want = torch.empty_like(scores)
    for g in groups.unique():
        rows = (groups == g).nonzero().flatten().tolist()
        logits = [float(log_rnd[i] + scores[i] / alg.alpha) for i in rows]
        top = max(logits)
        e = [torch.tensor(x - top, dtype=torch.float64).exp() for x in logits]
        w = [x / sum(e) for x in e]
        mean = sum(w) / len(w)
        for i, wi in zip(rows, w):
            want[i] = wi - mean
    assert torch.allclose(p.data.weights.double(), want, atol=1e-6)
    individual = prepared(dataclasses.replace(alg, baseline="individual")).data.weights
    assert not torch.allclose(individual, p.data.weights)  # the field switches the baseline

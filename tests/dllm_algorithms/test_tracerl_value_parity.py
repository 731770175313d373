"""TraceRL with its value model (`TraceRL(value_model=True)`) equals its authors' step in float64.

The authors' with-value step (Gen-Verse/dLLM-RL at 10b4fd1, rl.py:174-176: the value phase, then the
policy phase, on one rollout) is transcribed below: the rows of train/train_sdar_value.py
(``collect_training_data``, the same as train/rl_sdar.py's, transcribed in
tests/dllm_algorithms/test_tracerl_parity.py), the old values of the value model on them
(``compute_old_value_parallel``), the fragments gathered into per-token returns and advantages and
written back to the rows (``compute_returns_and_advantages_from_fragments``), the value loss of the
value model's update (``forward_process``), and the policy loss of train/train_sdar_policy.py with
those per-token advantages. Policy and value model are float64 stand-ins (functions of the noisy
canvas whose parameters are the "weights"), shared by both sides, so losses and the gradients of
both models' parameters are compared exactly. Only block models: the authors have no value model
for their masked-model trainers.
"""

from __future__ import annotations

import pytest
import torch

from dllm_algorithms import TraceRL
from dllm_rollout import RolloutBatch
from dllm_train import CriticInputs, LossInputs, RLBatch, SpecialTokens
from tests.dllm_algorithms.test_tracerl_parity import (
    BLOCK, EOS, MASK, PAD, P, V, StandIn, _dllmrl_rewards, _dllmrl_sdar_rows, _dllmrl_z_scores, _params, _rollout,
)
from tests.dllm_objectives.test_trace_parity import _dllmrl_returns


class ValueStandIn:
    """A differentiable stand-in value model: v_i = a[x_i] + mean_{j visible} c[x_j] + q[i] (one per position)."""

    mask_id, eos_id, pad_id, lockstep_group, block_length = MASK, EOS, PAD, None, BLOCK

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.p = params

    def values(self, noisy: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        vis = attention.to(torch.float64)
        ctx = (self.p["c"][noisy] * vis).sum(1, keepdim=True) / vis.sum(1, keepdim=True)
        return self.p["a"][noisy] + ctx + self.p["q"][: noisy.shape[1]]

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        return self.values(noisy_ids, attention_mask)


def _value_params(seed: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: 0.5 * torch.randn(n, generator=g, dtype=torch.float64) for k, n in {"a": V, "c": V, "q": length}.items()}


# dLLM-RL: train/train_sdar_policy.py:493-519 at 10b4fd1 (the model call replaced by its token log-probs;
# `adv` is the (rows, L) per-token advantage the value phase wrote)
def _dllmrl_policy_loss(logp_new_tok, logp_old_tok, p_mask, adv, eps, beta, L1):  # type: ignore[no-untyped-def]
    B = p_mask.shape[0]
    ratio = logp_new_tok - logp_old_tok
    ratio = torch.where(p_mask, ratio, torch.zeros_like(ratio)).clamp(-10.0, 10.0)
    ratio = torch.exp(ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    surrogate_tok = torch.min(ratio * adv, clipped * adv)
    surrogate_tok = surrogate_tok * p_mask
    surrogate_tok = surrogate_tok.sum(dim=1) / L1
    policy_loss = -(surrogate_tok.sum() / B)
    if beta > 0:
        kl_seq = logp_new_tok - logp_old_tok
        kl_seq = torch.where(p_mask, kl_seq, torch.zeros_like(kl_seq))
        t = (-kl_seq).clamp(-10.0, 10.0)
        kl_seq = t.exp() - 1.0 + kl_seq
        kl_seq = (kl_seq * p_mask).sum(dim=1) / L1
        return policy_loss + beta * kl_seq.sum() / B
    return policy_loss


# dLLM-RL: train/train_sdar_value.py:994-1005 at 10b4fd1 (the value model's call and its loss)
def _dllmrl_value_loss(value_model, extended_input_ids, p_mask, Return, old_values, eps, L1):  # type: ignore[no-untyped-def]
    B = p_mask.shape[0]
    values = value_model.values(extended_input_ids, torch.ones_like(p_mask))
    values = torch.where(p_mask, values, torch.zeros_like(values))
    v_clipped = old_values + (values - old_values).clamp(-eps, eps)
    loss_unclipped = (values - Return) ** 2
    loss_clipped = (v_clipped - Return) ** 2
    loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped) * p_mask
    loss = loss.sum(dim=1) / L1
    return loss.sum() / B


def _theirs(rollout: RolloutBatch, correct: list[list[float]], policy: tuple[StandIn, StandIn],
            value: tuple[ValueStandIn, ValueStandIn], *, shrink: int, gamma: float, lam: float,
            eps: float, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(policy loss, value loss, token advantages, returns) of the authors' step; the last two (rows, L)."""
    new, old = policy
    value_new, value_old = value
    L1 = rollout.response_ids.shape[1]
    rows, seq_ids, step_maps, rewards = [], [], {}, {}
    for i, reward in _dllmrl_rewards(correct):  # reward/rl_reward.py:105-124: the z-scored reward of kept groups
        step_map = rollout.unmask_step[i].tolist()  # type: ignore[index]
        for noisy, pm in _dllmrl_sdar_rows(rollout.response_ids[i], step_map, shrink):  # shrinks step_map in place
            rows.append((torch.cat([rollout.prompt_ids[i], noisy]), torch.cat([rollout.prompt_ids[i], rollout.response_ids[i]]),
                         torch.cat([torch.zeros(P, dtype=torch.bool), pm])))
            seq_ids.append(i)
        step_maps[i], rewards[i] = torch.as_tensor(step_map), reward
    noisy = torch.stack([x[0] for x in rows])
    clean = torch.stack([x[1] for x in rows])
    p_mask = torch.stack([x[2] for x in rows])
    attn = torch.ones_like(noisy, dtype=torch.bool)
    # dLLM-RL: train/train_sdar_value.py:661-683 (compute_old_value_parallel)
    with torch.no_grad():
        old_values = torch.where(p_mask, value_old.values(noisy, attn), torch.zeros(p_mask.shape, dtype=torch.float64))
    # dLLM-RL: train/train_sdar_value.py:746-857 (per sequence: gather the fragments' V_old, returns, write back)
    Return_mat = torch.zeros(p_mask.shape, dtype=torch.float64)
    adv_mat = torch.zeros(p_mask.shape, dtype=torch.float64)
    for s in step_maps:
        mine = [r for r, sid in enumerate(seq_ids) if sid == s]
        trainable_mask = rollout.response_ids[s].ne(PAD)  # post_num 0: no pad is trainable (:757-762)
        V_resp = torch.zeros(L1, dtype=torch.float64)
        filled = torch.zeros(L1, dtype=torch.bool)
        for row in mine:
            tail_mask = p_mask[row][P:]
            assert not filled[tail_mask].any()
            V_resp[tail_mask] = old_values[row, P:P + L1][tail_mask]
            filled[tail_mask] = True
        assert torch.all(filled[trainable_mask])
        R_resp, A_resp = _dllmrl_returns(step_maps[s], trainable_mask, rewards[s], V_resp, gamma, lam)
        R_full = torch.cat([torch.zeros(P, dtype=torch.float64), R_resp])
        A_full = torch.cat([torch.zeros(P, dtype=torch.float64), A_resp])
        for row in mine:
            pm = p_mask[row]
            Return_mat[row][pm] = R_full[pm]
            adv_mat[row][pm] = A_full[pm]
    with torch.no_grad():
        lp_old = old.logp(noisy, attn, clean)
    policy_loss = _dllmrl_policy_loss(new.logp(noisy, attn, clean), lp_old, p_mask, adv_mat, eps, beta, L1)
    value_loss = _dllmrl_value_loss(value_new, noisy, p_mask, Return_mat, old_values, eps, L1)
    return policy_loss, value_loss, adv_mat[p_mask], Return_mat[p_mask]


def _ours(rollout: RolloutBatch, correct: list[list[float]], policy: tuple[StandIn, StandIn],
          value: tuple[ValueStandIn, ValueStandIn], alg: TraceRL) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                           torch.Tensor]:
    new, old = policy
    value_new, value_old = value
    scores = torch.tensor([x for g in correct for x in g], dtype=torch.float64)
    gid = torch.arange(len(correct)).repeat_interleave(4)
    batch = RLBatch(rollout=rollout, scores=scores, group_ids=gid, tokens=SpecialTokens(MASK, EOS, PAD))
    data = alg.prepare(batch, torch.Generator().manual_seed(0))
    adv = torch.zeros(len(scores), dtype=torch.float64)  # the z-scores in float64 (see test_tracerl_parity.py)
    for i, z in _dllmrl_z_scores(correct):
        adv[i] = z
    with torch.no_grad():
        v_old = alg.values(old, batch, data, 0)
        critic_old = alg.critic_values(value_old, batch, data)
    targets = alg.critic_targets(batch, data, critic_old, adv)
    policy_loss, _ = alg.loss(alg.values(new, batch, data, 0),
                              LossInputs(batch=batch, data=data, iteration=0, advantages=adv, old=v_old, ref=None,
                                         critic=targets))
    value_loss, _ = alg.critic_loss(alg.critic_values(value_new, batch, data),
                                    CriticInputs(batch=batch, data=data, old=critic_old, targets=targets))
    # the authors' rows in their order: sample-major, then replay round (rows without a trained token dropped)
    return policy_loss, value_loss, targets.advantages[data.active], targets.returns[data.active]


@pytest.mark.parametrize("shrink", [1, 2])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.0), (0.9, 0.95)])
@pytest.mark.parametrize("beta", [0.0, 0.01])
def test_tracerl_with_value_step_equals_the_authors(shrink: int, gamma: float, lam: float, beta: float) -> None:
    rollout, correct = _rollout(True, seed=shrink)
    length = P + rollout.response_ids.shape[1]
    weights, vweights = _params(1, length), _value_params(2, length)
    moved = {k: (v + 0.3 * torch.randn_like(v)).requires_grad_(True) for k, v in weights.items()}
    vmoved = {k: (v + 0.3 * torch.randn_like(v)).requires_grad_(True) for k, v in vweights.items()}
    policy = (StandIn(moved, BLOCK), StandIn(weights, BLOCK))
    value = (ValueStandIn(vmoved), ValueStandIn(vweights))
    alg = TraceRL(shrink=shrink, clip=0.2, kl_coef=beta, value_model=True, gamma=gamma, lam=lam, value_clip=0.2)
    p_ours, v_ours, a_ours, r_ours = _ours(rollout, correct, policy, value, alg)
    p_theirs, v_theirs, a_theirs, r_theirs = _theirs(rollout, correct, policy, value, shrink=shrink, gamma=gamma,
                                                     lam=lam, eps=0.2, beta=beta)
    # token advantages and returns, row by row in the authors' order (sample, then round; position)
    torch.testing.assert_close(a_ours, a_theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(r_ours, r_theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(p_ours, p_theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(v_ours, v_theirs, rtol=0, atol=1e-12)
    for ours, theirs, params in ((p_ours, p_theirs, moved), (v_ours, v_theirs, vmoved)):
        g_ours = torch.autograd.grad(ours, list(params.values()))
        g_theirs = torch.autograd.grad(theirs, list(params.values()))
        for a, b in zip(g_ours, g_theirs):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        assert sum(float(g.abs().sum()) for g in g_ours) > 0
    assert a_ours.abs().sum() > 0 and not torch.equal(a_ours, r_ours)  # the value baseline is at work


def test_value_model_fields_are_validated() -> None:
    for field, bad in (("gamma", 1.5), ("lam", -0.1), ("value_clip", -1.0), ("value_lr", 0.0), ("value_every", 0)):
        with pytest.raises(ValueError, match=f"algorithm.{field} "):
            TraceRL(value_model=True, **{field: bad})  # type: ignore[arg-type]
    assert TraceRL().critic is None
    spec = TraceRL(value_model=True, value_lr=1e-5, value_every=2).critic
    assert spec is not None and (spec.lr, spec.every) == (1e-5, 2)

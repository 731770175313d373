"""Tests for dllm_objectives.trajectory (CJ-GRPO, JustGRPO, MDPO; docs/algorithms.md#cj-grpo)."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def test_unmask_steps_and_replay_plan() -> None:
    # K = 3 steps over 4 positions; position 3 never unmasked (padding)
    traj = torch.tensor([[[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]])
    step = do.unmask_steps(traj)
    assert step.tolist() == [[1, 0, 2, -1]]
    plan = do.replay_plan(step)
    # state k masks positions with step >= k
    assert plan.mask[0].int().tolist() == [[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 1, 0]]
    assert plan.meta["scored"][0].int().tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    with pytest.raises(ValueError, match="more than one step"):
        do.unmask_steps(torch.ones(1, 2, 2))


def test_cj_paper_exact_weights_231_case_has_six_transitions() -> None:
    # three blocks with 2, 3, 1 local steps (one token per step) -> 6 transitions, weight 1/6 each
    step = torch.tensor([[0, 1, 0, 1, 2, 0]])
    blocks = torch.tensor([[0, 0, 1, 1, 1, 2]])
    w = do.cj_token_weights(step, 3, block_ids=blocks)
    assert w.sum().item() == pytest.approx(1.0)
    assert torch.allclose(w.sum(1), torch.full((1, 6), 1 / 6))


def test_cj_paper_exact_weights_sum_to_one_and_token_mean_per_transition() -> None:
    # row 0: step 0 has 2 tokens, step 1 has 1 token -> 2 transitions: 1/4, 1/4, 1/2
    step = torch.tensor([[0, 0, 1, -1], [0, 1, 2, 3]])
    w = do.cj_token_weights(step, 4)
    per_sample = w.sum((1, 2))
    assert per_sample.tolist() == pytest.approx([0.5, 0.5])  # 1 / B each
    assert w[0].sum(0).tolist() == pytest.approx([0.125, 0.125, 0.25, 0.0])


def test_cj_paper_exact_is_micro_batch_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    step = torch.randint(0, 4, (6, 8), generator=g)
    lp, old = torch.randn(6, 4, 8, generator=g), torch.randn(6, 4, 8, generator=g)
    adv = torch.randn(6, generator=g)
    full, _ = do.weighted_policy_loss(lp, old, adv, do.cj_token_weights(step, 4))
    parts = [
        do.weighted_policy_loss(lp[s], old[s], adv[s], do.cj_token_weights(step[s], 4, num_sequences=6))[0]
        for s in (slice(0, 2), slice(2, 6))
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-6)


def test_cj_identity_at_old_policy() -> None:
    # paper-exact: -mean_i A_i; step_token_mean: -(1/K) sum_k tokenmean_{T_k}(A)
    step = torch.tensor([[0, 1, 1], [0, 0, 1]])
    adv = torch.tensor([1.0, 3.0])
    lp = torch.zeros(2, 2, 3)
    loss, _ = do.weighted_policy_loss(lp, lp, adv, do.cj_token_weights(step, 2))
    assert loss.item() == pytest.approx(-2.0)
    # step 0 tokens: A = 1, 3, 3 -> mean 7/3; step 1 tokens: 1, 1, 3 -> 5/3; -(7/3 + 5/3) / 2 = -2
    w = do.cj_token_weights(step, 2, mode="step_token_mean")
    loss, _ = do.weighted_policy_loss(lp, lp, adv, w)
    assert loss.item() == pytest.approx(-2.0)


def test_justgrpo_ar_states_give_exact_sequence_likelihood(toy) -> None:  # type: ignore[no-untyped-def]
    # state j masks position j and every later one: exact conditional = p(o_j | o_<j), so the
    # sum over states is log p(o) by the chain rule.
    valid = torch.ones(1, 4, dtype=torch.bool)
    plan = do.replay_plan(do.autoregressive_steps(valid))
    lp = toy.token_logp(plan.mask)  # [1, K=4, 4]
    total = (lp * plan.meta["scored"].float()).sum().item()
    assert total == pytest.approx(toy.log_p, abs=1e-5)
    assert plan.num_samples == 4  # number of states = sum_i L_i


def test_mdpo_step_scores_hand_case() -> None:
    # r = [0, 1, 1]: d = [1, 2, 1]; c = [mean(1, 1), mean(1), r_2] = [1, 1, 1]; s = [2, 3, 2]
    s = do.mdpo_step_scores(torch.tensor([[0.0, 1.0, 1.0]]))
    assert s.tolist() == [[2.0, 3.0, 2.0]]
    adv = do.mdpo_step_advantages(torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), torch.tensor([0, 0]))
    assert torch.allclose(adv.sum(0), torch.zeros(3), atol=1e-5)  # zero mean per step in a group


def test_mdpo_topk_steps_sorted() -> None:
    adv = torch.tensor([[0.1, -3.0, 0.5, 2.0], [0.1, 1.0, -0.2, 2.0]])
    assert do.mdpo_topk_steps(adv, 2).tolist() == [1, 3]
    assert do.mdpo_topk_steps(adv, 9).tolist() == [0, 1, 2, 3]


def test_mdpo_loss_identity_at_old_policy() -> None:
    # c = 1, l = l_old: loss = -R sum_rows A_row / sum_rows |m_row| (lam |m| = R), R = 4
    m = torch.tensor([[True, True, False, False], [True, False, False, False]])
    adv = torch.tensor([1.0, -2.0])
    lp = torch.zeros(2, 4)
    loss, _ = do.mdpo_loss(lp, lp, adv, m, torch.ones(2, 4))
    assert loss.item() == pytest.approx(-4 * (1 - 2) / 3)
    with pytest.raises(ValueError, match="ref_logp"):
        do.mdpo_loss(lp, lp, adv, m, torch.ones(2, 4), beta=0.1)


def test_justgrpo_chunked_loss_sum_equals_unchunked() -> None:
    g = torch.Generator().manual_seed(5)
    resp = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    lp, old = torch.randn(2, 6, generator=g), torch.randn(2, 6, generator=g)
    adv = torch.tensor([1.0, -0.5])
    full, _ = do.clipped_policy_loss(lp, old, adv, resp)
    total = float(resp.sum())
    chunks = []
    for c in range(3):  # positions 2c, 2c + 1
        in_chunk = torch.zeros_like(resp)
        in_chunk[:, 2 * c: 2 * c + 2] = True
        part, _ = do.clipped_policy_loss(lp, old, adv, resp & in_chunk,
                                         agg="seq-mean-token-sum-norm", norm_const=total)
        chunks.append(part)
    assert sum(chunks).item() == pytest.approx(full.item(), abs=1e-6)  # type: ignore[union-attr]

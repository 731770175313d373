"""Tests for dllm_objectives.policy (docs/algorithms.md#clipped-surrogate, #invariants)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def test_aggregate_four_modes_hand_case() -> None:
    # v = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 0, 0]]: masked sum 1 + 2 + 4 = 7, count 3
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert do.aggregate(v, m, "token-mean").item() == pytest.approx(7 / 3)
    assert do.aggregate(v, m, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert do.aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert do.aggregate(v, m, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 3)  # / R = 3
    assert do.aggregate(v, m, "seq-mean-token-sum-norm", norm_const=7).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="token-mean"):
        do.aggregate(v, m, "mean")


def test_token_mean_of_broadcast_sequence_values_is_length_weighted() -> None:
    seq = torch.tensor([1.0, 4.0])
    m = torch.tensor([[True, True, True], [True, False, False]])
    # (3 * 1 + 1 * 4) / 4 = 1.75
    assert do.aggregate(seq[:, None].expand(2, 3), m).item() == pytest.approx(1.75)


def test_clipped_loss_hand_cases_and_zero_gradient_when_clipped() -> None:
    # A = 2 > 0, r = 1.5, eps 0.2 -> u = max(-3, -2.4) = -2.4 = -1.2 A, clipped, no gradient
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, met = do.clipped_policy_loss(lp, torch.zeros(1, 1), torch.tensor([2.0]), torch.ones(1, 1, dtype=torch.bool))
    assert loss.item() == pytest.approx(-2.4) and met["clip_frac"].item() == 1.0
    assert torch.autograd.grad(loss, lp)[0].item() == 0.0
    # A = -1, r = 10, c = 3 -> u = max(10, 1.2) = 10; dual clip min(10, 3) = 3 = -3 A, no gradient
    lp = torch.tensor([[math.log(10.0)]], requires_grad=True)
    loss, met = do.clipped_policy_loss(lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1, dtype=torch.bool))
    assert loss.item() == pytest.approx(3.0) and met["clip_frac_lower"].item() == 1.0
    assert torch.autograd.grad(loss, lp)[0].item() == 0.0
    # without dual clip: 10
    loss, _ = do.clipped_policy_loss(lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1, dtype=torch.bool), dual_clip=None)
    assert loss.item() == pytest.approx(10.0)


def test_on_policy_ratio_is_exactly_one_and_loss_is_minus_token_mean_advantage() -> None:
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 5, generator=g)).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    m = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    loss, met = do.clipped_policy_loss(lp, lp.detach(), adv, m)
    assert met["ratio_mean"].item() == 1.0 and met["ppo_kl"].item() == 0.0
    # -token-mean(A) = -(3 * 1 - 5 * 2 + 0.5) / 9
    assert loss.item() == pytest.approx(-(3 - 10 + 0.5) / 9)
    # gradient at r = 1 is -A / 9 on valid tokens
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.allclose(grad, -adv[:, None].expand(3, 5) * m.float() / 9)


def test_zero_advantage_gives_zero_gradient_and_padding_invariance() -> None:
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(2, 4, generator=g).requires_grad_(True)
    old = torch.randn(2, 4, generator=g)
    m = torch.tensor([[True, True, False, False], [True, True, True, False]])
    loss, _ = do.clipped_policy_loss(lp, old, torch.zeros(2), m)
    assert torch.autograd.grad(loss, lp)[0].abs().sum().item() == 0.0
    adv = torch.tensor([1.0, -1.0])
    base, _ = do.clipped_policy_loss(lp, old, adv, m)
    junk = lp.detach().clone()
    junk[~m] = 1e3  # padded values must not matter
    out, _ = do.clipped_policy_loss(junk, old, adv, m)
    assert out.item() == pytest.approx(base.item())
    wide, _ = do.clipped_policy_loss(  # extra padding columns do not matter either
        torch.cat([lp, torch.zeros(2, 3)], 1), torch.cat([old, torch.zeros(2, 3)], 1), adv,
        torch.cat([m, torch.zeros(2, 3, dtype=torch.bool)], 1),
    )
    assert wide.item() == pytest.approx(base.item())


def test_grpo_equals_dapo_with_equal_clips_and_differs_only_in_the_upper_band() -> None:
    # reference formula written out: max(-A r, -A clip(r, 0.8, 1.2)), dual clip 3 for A < 0
    g = torch.Generator().manual_seed(2)
    lp, old = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    adv = torch.randn(4, generator=g)
    m = torch.ones(4, 6, dtype=torch.bool)
    r = torch.exp(lp - old)
    a = adv[:, None]
    u = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    ref = torch.where(a < 0, torch.minimum(u, -3 * a), u).mean()
    grpo, _ = do.clipped_policy_loss(lp, old, adv, m)
    dapo_equal, _ = do.clipped_policy_loss(lp, old, adv, m, clip_low=0.2, clip_high=0.2)
    assert grpo.item() == pytest.approx(ref.item()) and dapo_equal.item() == grpo.item()
    # clip-higher 0.28 changes only A > 0 tokens with r > 1.2
    dapo, _ = do.clipped_policy_loss(lp, old, adv, m, clip_high=0.28)
    band = (a > 0) & (r > 1.2)
    assert (dapo.item() != grpo.item()) == bool(band.any())


def test_clip_argument_errors() -> None:
    x = torch.zeros(1, 1)
    m = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="dual_clip"):
        do.clipped_policy_loss(x, x, torch.zeros(1), m, dual_clip=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        do.clipped_policy_loss(x, x, torch.zeros(1), m, clip_low=-0.1)
    with pytest.raises(ValueError, match="advantages"):
        do.clipped_policy_loss(x, x, torch.zeros(2), m)
    with pytest.raises(ValueError, match="old_logp"):
        do.clipped_policy_loss(x, torch.zeros(1, 2), torch.zeros(1), m)


def test_bgpo_on_policy_equals_exp_ratio_in_value_and_gradient() -> None:
    v = torch.tensor([-0.3, -0.7, -0.2], requires_grad=True)
    adv = torch.tensor([1.5, -2.0, 0.0])
    m = torch.ones(3, 4, dtype=torch.bool)
    loss, _ = do.bgpo_policy_loss(v, v.detach(), adv, m)
    ref, _ = do.clipped_policy_loss(v[:, None].expand(3, 4), v.detach()[:, None].expand(3, 4), adv, m)
    assert loss.item() == pytest.approx(-adv.mean().item()) and loss.item() == pytest.approx(ref.item())
    g1 = torch.autograd.grad(loss, v, retain_graph=True)[0]
    g2 = torch.autograd.grad(ref, v)[0]
    assert torch.allclose(g1, g2)


def test_bgpo_linear_for_positive_advantage_and_lower_bound() -> None:
    # A = 1, deltas 0.1 and -0.1 (unclipped): per-sample losses -(1.1) and -(0.9), mean -1 = -(1 + mean d)
    m = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([1.0])
    losses = [do.bgpo_policy_loss(torch.tensor([d]), torch.zeros(1), adv, m)[0].item() for d in (0.1, -0.1)]
    assert sum(losses) / 2 == pytest.approx(-1.0)
    # objective (= -loss) never exceeds the exp-ratio objective, unclipped, any sign of A
    d = torch.linspace(-3, 3, 61)
    for a in (1.0, -1.0):
        bg, _ = do.bgpo_policy_loss(d, torch.zeros(61), torch.full((61,), a), torch.ones(61, 1, dtype=torch.bool),
                                    clip_low=1.0, clip_high=1e9, dual_clip=None, agg="seq-mean-token-sum")
        ex = (-a * torch.exp(d)).mean()
        assert -bg.item() <= -ex.item() + 1e-6
    # no NaN for delta <= -1 with A > 0 (the reference's exp(log(1 + d)) was NaN)
    out, _ = do.bgpo_policy_loss(torch.tensor([-2.0]), torch.zeros(1), adv, m)
    assert math.isfinite(out.item())


def test_sequence_clip_log_domain_equals_standard_formula_and_is_finite() -> None:
    g = torch.Generator().manual_seed(3)
    rho = torch.randn(64, generator=g)
    adv = torch.randn(64, generator=g)
    loss, _ = do.sequence_clip_loss(rho, torch.zeros(64), adv, clip_low=0.2, clip_high=0.28)
    r = torch.exp(rho)
    ref = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.28)).mean()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    # rho = 1e4 with A > 0 is clipped at 1.2: loss -1.2 A, finite, zero gradient
    big = torch.tensor([1e4], requires_grad=True)
    loss, met = do.sequence_clip_loss(big, torch.zeros(1), torch.tensor([1.0]))
    assert loss.item() == pytest.approx(-1.2) and met["clip_frac"].item() == 1.0
    assert torch.autograd.grad(loss, big)[0].item() == 0.0
    # on-policy: -mean A
    loss, _ = do.sequence_clip_loss(rho, rho, adv)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)


def test_weighted_policy_loss_matches_manual_sum() -> None:
    # on-policy token losses are -A; weights 0.25 and 0.75 on A = 2 -> -(0.5 + 1.5) = -2
    lp = torch.zeros(1, 2, 2)
    w = torch.tensor([[[0.25, 0.0], [0.0, 0.75]]])
    loss, _ = do.weighted_policy_loss(lp, lp, torch.tensor([2.0]), w)
    assert loss.item() == pytest.approx(-2.0)

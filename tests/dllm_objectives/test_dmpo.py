"""Tests for dllm_objectives.dmpo (docs/algorithms.md#dmpo)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def test_weights_sum_to_one_per_group_and_baselines_sum_to_zero() -> None:
    g = torch.Generator().manual_seed(0)
    r, rho = torch.rand(8, generator=g), torch.randn(8, generator=g)
    gid = torch.arange(8) // 4
    w, wn = do.dmpo_weights(r, rho, gid, alpha=0.1)
    for k in range(2):
        assert w[gid == k].sum().item() == pytest.approx(1.0)
    for kind, kw in (("group", {}), ("individual", {"neg_weights": wn}),
                     ("model", {"model_log_ratio": torch.randn(8, generator=g)})):
        c = do.dmpo_baseline(w, gid, kind=kind, **kw)  # type: ignore[arg-type]
        for k in range(2):
            assert abs(c[gid == k].sum().item()) < 1e-6, kind


def test_weights_hand_case_and_special_alphas() -> None:
    # alpha = 1, rho = 0, rewards 0 and ln 3 -> softmax(0, ln 3) = (1/4, 3/4)
    r = torch.tensor([0.0, math.log(3.0)])
    w, wn = do.dmpo_weights(r, torch.zeros(2), torch.zeros(2, dtype=torch.long), alpha=1.0)
    assert w.tolist() == pytest.approx([0.25, 0.75]) and wn.tolist() == pytest.approx([0.75, 0.25])
    raw, neg = do.dmpo_weights(r, torch.zeros(2), torch.zeros(2, dtype=torch.long), alpha=-1)
    assert torch.equal(raw, r) and torch.equal(neg, -r)
    # alpha -> infinity: w ~ p_ref / p_behaviour = exp(rho) normalised
    rho = torch.tensor([0.0, math.log(2.0)])
    w, _ = do.dmpo_weights(r, rho, torch.zeros(2, dtype=torch.long), alpha=1e9)
    assert w.tolist() == pytest.approx([1 / 3, 2 / 3])


def test_equal_rewards_and_rho_give_zero_wdce_loss_with_group_baseline() -> None:
    w, _ = do.dmpo_weights(torch.ones(4), torch.zeros(4), torch.zeros(4, dtype=torch.long), alpha=0.1)
    c = do.dmpo_baseline(w, torch.zeros(4, dtype=torch.long), kind="group")
    lp = -torch.rand(4, 2, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 2, 5, dtype=torch.bool)
    assert do.wdce_loss(lp, mask, c).abs().item() < 1e-7


def test_wdce_hand_case() -> None:
    # one sample, M = 2 replicates: masked CE means 1.5 ((1 + 2) / 2) and 3 (|S| = 1);
    # (1 / M) * w * (1.5 + 3) = 0.5 * 2 * 4.5 = 4.5
    lp = torch.tensor([[[-1.0, -2.0, -7.0], [-3.0, -9.0, -9.0]]])
    mask = torch.tensor([[[True, True, False], [True, False, False]]])
    assert do.wdce_loss(lp, mask, torch.tensor([2.0])).item() == pytest.approx(4.5)


def test_wddo_hand_case() -> None:
    # g = 0: -w log 1/2 - a log 1/2 = (w + a) log 2 with w = 1, a = 1 -> 2 log 2
    out = do.wddo_loss(torch.tensor([-5.0]), torch.tensor([-5.0]), torch.tensor([1.0]))
    assert out.item() == pytest.approx(2 * math.log(2.0))


def test_ess_coeff_is_within_bounds_and_matches_target() -> None:
    g = torch.Generator().manual_seed(1)
    rho, r = torch.randn(16, generator=g) * 3, torch.rand(16, generator=g)
    k = do.dmpo_ess_coeff(rho, r, alpha=0.04, ess_target=0.5)
    assert 0.01 <= k <= 0.99
    x = rho + r / 0.04
    w = torch.softmax(k * x, 0)
    ess = 1.0 / (16 * (w**2).sum().item())
    # the ESS is monotone in k: either it hits the target or k sits at a bound
    assert abs(ess - 0.5) < 1e-3 or k in (pytest.approx(0.01, abs=1e-3), pytest.approx(0.99, abs=1e-3))


def test_dmpo_sequence_elbo_hand_case() -> None:
    # L = 4; replicate 0 masks 2 tokens (-1, -1) -> 4/2 * -2 = -4; replicate 1 masks 1 (-3) -> -12
    lp = torch.tensor([[[-1.0, -1.0, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[[True, True, False, False], [True, False, False, False]]])
    valid = torch.ones(1, 4, dtype=torch.bool)
    assert do.dmpo_sequence_elbo(lp, mask, valid).item() == pytest.approx(-8.0)
    assert do.dmpo_sequence_elbo(lp, mask, valid, reduce="sum").item() == pytest.approx(-16.0)

"""Tests for dllm_objectives.kl (docs/algorithms.md#kl)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def test_kl_hand_values() -> None:
    # d = logp - ref = -1: k1 = -1, abs = 1, k2 = 0.5, k3 = e^1 - 1 - 1 = 0.718282
    lp, ref = torch.tensor([-2.0]), torch.tensor([-1.0])
    assert do.kl_penalty(lp, ref, "k1").item() == -1.0
    assert do.kl_penalty(lp, ref, "abs").item() == 1.0
    assert do.kl_penalty(lp, ref, "k2").item() == 0.5
    assert do.kl_penalty(lp, ref, "k3").item() == pytest.approx(math.e - 2.0, abs=1e-6)
    assert do.kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(math.e - 2.0, abs=1e-6)


def test_k3_nonnegative_zero_iff_equal_and_clamped() -> None:
    g = torch.Generator().manual_seed(0)
    lp, ref = torch.randn(100, generator=g), torch.randn(100, generator=g)
    k3 = do.kl_penalty(lp, ref)
    assert bool((k3 > 0).all()) and bool((do.kl_penalty(lp, lp) == 0).all())
    assert bool((k3 <= 10.0).all())


def test_kl_never_nan_or_inf_even_for_extreme_inputs() -> None:
    lp = torch.tensor([-1e4, 1e4, 0.0, -50.0, 80.0], requires_grad=True)
    ref = torch.tensor([1e4, -1e4, 0.0, 50.0, -80.0])
    for kind in ("k1", "abs", "k2", "k3"):
        out = do.kl_penalty(lp, ref, kind)
        assert bool(torch.isfinite(out).all()), kind
        (grad,) = torch.autograd.grad(out.sum(), lp)
        assert bool(torch.isfinite(grad).all()), kind
    assert bool(torch.isfinite(do.kl_penalty(lp, ref, "k3", clamp=None)).all())
    # DARE variant: log(1 + d) for A > 0 was NaN for d <= -1; fixed (floored)
    adv = torch.ones(5)
    out = do.kl_penalty(lp, ref, "k3", dare_advantages=adv)
    assert bool(torch.isfinite(out).all())


def test_dare_advantage_transform_parity() -> None:
    # d = 0.5 with A > 0 -> log(1.5) replaces d; with A < 0 d is kept
    lp, ref = torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0])
    out = do.kl_penalty(lp, ref, "k1", dare_advantages=torch.tensor([1.0, -1.0]))
    assert out.tolist() == pytest.approx([math.log(1.5), 0.5])


def test_unknown_kind_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="k3"):
        do.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_k1_is_unbiased_on_samples() -> None:
    # KL(p || q) for p = N(0, 1) samples, q = N(1, 1): exact 0.5
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200000, generator=g)
    logp = -0.5 * x**2
    logq = -0.5 * (x - 1) ** 2
    assert do.kl_penalty(logp, logq, "k1").mean().item() == pytest.approx(0.5, abs=0.01)
    assert do.kl_penalty(logp, logq, "k3", clamp=None).mean().item() == pytest.approx(0.5, abs=0.02)


def test_sequence_kl_espo_k1_gradient_correction() -> None:
    # E = 3, E_ref = 1, R = 2: value (3 - 1) / 2 = 1; gradient (1 + 2) / 2 = 1.5
    e = torch.tensor([3.0], requires_grad=True)
    out = do.sequence_kl(e, torch.tensor([1.0]), "k1", length=2.0, k1_grad_correction=True)
    assert out.item() == 1.0
    (grad,) = torch.autograd.grad(out.sum(), e)
    assert grad.item() == pytest.approx(1.5)
    # k2: 0.5 * 4 / 2 = 1
    assert do.sequence_kl(e, torch.tensor([1.0]), "k2", length=2.0).item() == 1.0
    with pytest.raises(ValueError, match="k1"):
        do.sequence_kl(e, e, "k2", k1_grad_correction=True)

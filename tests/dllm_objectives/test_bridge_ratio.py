"""Tests for dllm_objectives.bridge_ratio (docs/algorithms.md#bridgeratio-grpo)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def test_hand_worked_log_ratio_and_delta_correction() -> None:
    # new paths l = (0, ln 3): logsumexp = ln 4; old (0, 0): ln 2 -> log r = ln 2
    new = torch.tensor([[0.0, math.log(3.0)]])
    old = torch.zeros(1, 2)
    lr, m = do.bridge_log_ratio(new, old)
    assert lr.item() == pytest.approx(math.log(2.0))
    assert m["bridge_ratio_mean"].item() == pytest.approx(2.0) and m["bridge_correction"].item() == 0.0
    # delta: weights (1, 3) -> CV^2 = var / mean^2 = 1 / 4 (old: 0); term = (1/4 - 0) / (2 K) = 1/16
    lr_d, m_d = do.bridge_log_ratio(new, old, correction="delta")
    assert lr_d.item() == pytest.approx(math.log(2.0) + 1 / 16)
    assert m_d["bridge_correction"].item() == pytest.approx(1 / 16)
    # cumulant: d = (0, ln 3), old weights (1/2, 1/2): mean ln3 / 2, var (ln3 / 2)^2 -> mean + var / 2
    half = math.log(3.0) / 2
    assert do.bridge_log_ratio(new, old, correction="cumulant")[0].item() == pytest.approx(half + half**2 / 2)
    # jackknife, K = 2: 2 ln 2 - mean(0 - 0, ln 3 - 0) = 2 ln 2 - ln3 / 2
    jk = do.bridge_log_ratio(new, old, correction="jackknife")[0].item()
    assert jk == pytest.approx(2 * math.log(2.0) - half)


def test_hand_worked_loss_clip_and_dual_clip() -> None:
    new = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], requires_grad=True)
    old = torch.zeros(2, 2)
    mask = torch.ones(2, 3, dtype=torch.bool)
    # r = 2 for both rows. A = +1: max(-2, -1.2) = -1.2 (clipped, no gradient)
    # A = -1: max(2, 1.2) = 2, dual clip min(2, 3) = 2 -> token-mean (3 * -1.2 + 3 * 2) / 6 = 0.4
    loss, m = do.bridge_ratio_policy_loss(new, old, torch.tensor([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(0.4, abs=1e-6)
    assert m["clip_frac"].item() == pytest.approx(0.5) and m["dual_clip_frac"].item() == 0.0
    (g,) = torch.autograd.grad(loss, new)
    # row 1: d(A r)/dl_k with A = -1: -(-1) * r * softmax_k(new) * 3 / 6 = 2 * (1/4, 3/4) / 2
    assert g[0].abs().sum().item() == 0.0
    torch.testing.assert_close(g[1], torch.tensor([0.25, 0.75]))
    # A = -1 and r = 10 -> dual clip caps at -A c = 3
    big = torch.tensor([[math.log(10.0)]])
    loss_c, m_c = do.bridge_ratio_policy_loss(big, torch.zeros(1, 1), torch.tensor([-1.0]), mask[:1])
    assert loss_c.item() == pytest.approx(3.0) and m_c["dual_clip_frac"].item() == 1.0


def test_on_policy_ratio_is_one_and_gradient_is_path_softmax_weighted() -> None:
    g = torch.Generator().manual_seed(0)
    old = -3 * torch.rand(3, 4, generator=g)
    new = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    loss, m = do.bridge_ratio_policy_loss(new, old, adv, mask)
    lengths = mask.sum(-1).float()
    assert loss.item() == pytest.approx(float(-(adv * lengths).sum() / lengths.sum()), rel=1e-6)
    assert m["bridge_ratio_mean"].item() == pytest.approx(1.0) and m["clip_frac"].item() == 0.0
    (grad,) = torch.autograd.grad(loss, new)
    expected = -(adv * lengths / lengths.sum())[:, None] * torch.softmax(old, 1)
    torch.testing.assert_close(grad, expected)


def test_zero_advantage_zero_gradient_and_path_order_invariance() -> None:
    g = torch.Generator().manual_seed(1)
    new = torch.randn(4, 3, generator=g, requires_grad=True)
    old = torch.randn(4, 3, generator=g)
    mask = torch.ones(4, 5, dtype=torch.bool)
    loss, _ = do.bridge_ratio_policy_loss(new, old, torch.zeros(4), mask)
    (grad,) = torch.autograd.grad(loss, new)
    assert float(grad.abs().sum()) == 0.0
    perm = torch.tensor([2, 0, 1])
    for c in do.BRIDGE_CORRECTIONS:
        a = do.bridge_log_ratio(new, old, correction=c)[0]
        b = do.bridge_log_ratio(new[:, perm], old[:, perm], correction=c)[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_padding_does_not_change_the_loss() -> None:
    g = torch.Generator().manual_seed(2)
    new, old = torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)
    adv = torch.tensor([0.7, -0.3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    wide = torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], 1)
    a = do.bridge_ratio_policy_loss(new, old, adv, mask)[0]
    b = do.bridge_ratio_policy_loss(new, old, adv, wide)[0]
    assert a.item() == pytest.approx(b.item(), rel=1e-6)


def test_bad_arguments_name_the_field() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="jackknife"):
        do.bridge_log_ratio(x, x, correction="bias")
    with pytest.raises(ValueError, match="path_scores"):
        do.bridge_log_ratio(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="log_ratio_clip"):
        do.bridge_ratio_policy_loss(x, x, torch.zeros(2), torch.ones(2, 4, dtype=torch.bool), log_ratio_clip=0.0)
    with pytest.raises(ValueError, match="old_path_scores"):
        do.bridge_log_ratio(x, torch.zeros(2, 4))

"""Tests for dllm_objectives.preference (docs/algorithms.md#dpo, #vrpo)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def test_dpo_hand_case() -> None:
    # margin (-1 - -3) - (-2 - -2) = 2; beta 0.5 -> logit 1; loss -log sigmoid(1) = 0.313262
    loss = do.dpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                       torch.tensor([-2.0]), beta=0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-6)
    # DARE VRPO divides by R = 512: logit 2 * 0.5 / 512
    z = do.dpo_logits(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                      torch.tensor([-2.0]), beta=0.5, length_normalizer=512)
    assert z.item() == pytest.approx(1.0 / 512)


def test_dpo_policy_equals_reference_gives_log2_with_shared_masks() -> None:
    # VRPO: identical parameters + shared masks -> identical ELBOs -> logit exactly 0
    valid = torch.ones(2, 6, dtype=torch.bool)
    plan = do.count_masks(valid, 4, generator=torch.Generator().manual_seed(0))
    lp = -torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(1))
    e = do.elbo(lp, plan).mean(-1)  # [2]: chosen, rejected
    loss = do.dpo_loss(e[:1], e[1:], e[:1].clone(), e[1:].clone(), beta=0.2)
    assert loss.item() == pytest.approx(math.log(2.0), abs=1e-7)


def test_dpo_monotone_in_margin_and_swap_symmetry() -> None:
    zero = torch.zeros(5)
    margins = torch.linspace(-2, 2, 5)
    losses = [do.dpo_loss(m[None], zero[:1], zero[:1], zero[:1], beta=1.0).item() for m in margins]
    assert all(a > b for a, b in zip(losses, losses[1:]))
    z = do.dpo_logits(margins, zero, zero, zero, beta=1.0)
    z_swap = do.dpo_logits(zero, margins, zero, zero, beta=1.0)
    assert torch.equal(z, -z_swap)
    with pytest.raises(ValueError, match="beta"):
        do.dpo_loss(zero, zero, zero, zero, beta=0.0)

"""Tests for dllm_objectives.sandwich (SPG, docs/algorithms.md#spg)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do


def _layout(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    # prompt cols 0-3 (valid 1-3), response cols 4-15 with 10 valid tokens, block length 4
    prompt = torch.zeros(b, 16, dtype=torch.bool)
    prompt[:, 1:4] = True
    resp = torch.zeros(b, 16, dtype=torch.bool)
    resp[:, 4:14] = True
    return prompt, resp


def test_spg_block_masks_structure() -> None:
    prompt, resp = _layout(300)
    plan = do.spg_block_masks(prompt, resp, 1, response_start=4, block_length=4,
                              generator=torch.Generator().manual_seed(0))
    beta, k = plan.meta["block_index"][:, 0], plan.meta["counts"][:, 0]
    assert bool((beta < 3).all())  # ceil(10 / 4) = 3 valid blocks
    blk = (torch.arange(16) - 4).div(4, rounding_mode="floor")
    m = plan.mask[:, 0]
    for i in range(300):
        b = int(beta[i])
        lam = min(4, 10 - 4 * b)
        in_blk = resp[i] & (blk == b)
        assert int(m[i][in_blk].sum()) == int(k[i]) and 1 <= int(k[i]) <= lam
        assert bool(m[i][(blk > b) & (torch.arange(16) >= 4)].all())  # later blocks + padding
        assert plan.p_mask[i, 0][in_blk].allclose((k[i] / lam).float())
    # prompt and earlier clean blocks at rate ~0.15 (3 prompt tokens * 300 rows + earlier blocks)
    clean = prompt | (resp & (blk[None, :] < beta[:, None]))
    rate = m[clean].float().mean().item()
    n = int(clean.sum())
    assert abs(rate - 0.15) < 5 * math.sqrt(0.15 * 0.85 / n)
    assert not bool(m[:, 0].any())  # prompt padding never


def test_spg_bounds_order_single_copy() -> None:
    prompt, resp = _layout(8)
    plan = do.spg_block_masks(prompt, resp, 1, response_start=4, block_length=4,
                              generator=torch.Generator().manual_seed(1))
    lp = -torch.rand(8, 1, 16, generator=torch.Generator().manual_seed(2)) * 3
    pos, neg = torch.ones(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool)
    lower = do.spg_sequence_logp(lp, plan, resp, pos)
    mix = do.spg_sequence_logp(lp, plan, resp, neg)
    upper = do.spg_sequence_logp(lp, plan, resp, neg, negative="eubo")
    assert bool((lower <= mix + 1e-6).all()) and bool((mix <= upper + 1e-6).all())
    assert torch.equal(do.spg_sequence_logp(lp, plan, resp, neg, negative="zero"), torch.zeros(8))


def test_spg_all_probabilities_one() -> None:
    # p = 1 everywhere: l+ = 0 and EUBO = -log(t_hat) / beta with t_hat = |S| / L
    prompt, resp = _layout(4)
    plan = do.spg_block_masks(prompt, resp, 1, response_start=4, block_length=4,
                              generator=torch.Generator().manual_seed(3))
    lp = torch.zeros(4, 1, 16)
    neg = torch.zeros(4, dtype=torch.bool)
    assert torch.equal(do.spg_sequence_logp(lp, plan, resp, ~neg), torch.zeros(4))
    t_hat = (plan.mask[:, 0] & resp).sum(-1) / 10.0
    eubo = do.spg_sequence_logp(lp, plan, resp, neg, negative="eubo")
    assert torch.allclose(eubo, -torch.log(t_hat) / 1.5)


def test_spg_loss_hand_case() -> None:
    # sum(-A l L) / sum L = -(1 * -2 * 3 + (-1) * -1 * 1) / 4 = -(-6 + 1) / 4 = 1.25
    out = do.spg_loss(torch.tensor([-2.0, -1.0]), torch.tensor([1.0, -1.0]), torch.tensor([3, 1]))
    assert out.item() == pytest.approx(1.25)

"""Tests for dllm_objectives.count_masking (M3 stratified counts, M4 ESPO counts)."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def test_count_masks_exact_counts_and_p_mask() -> None:
    valid = torch.tensor([[True] * 6 + [False] * 2, [True] * 3 + [False] * 5, [False] * 8])
    plan = do.count_masks(valid, 4, generator=torch.Generator().manual_seed(0))
    counts = plan.meta["counts"]
    assert bool((plan.mask.sum(-1) == counts).all())
    assert not bool((plan.mask & ~valid[:, None, :]).any())  # padding never
    lengths = torch.tensor([6, 3, 0])
    assert bool(((counts[:2] >= 1) & (counts[:2] <= lengths[:2, None])).all())
    assert bool((counts[2] == 0).all())  # empty row: nothing masked
    assert torch.allclose(plan.p_mask[0, :, 0], counts[0] / 6.0)


def test_count_masks_stratification_formula() -> None:
    # L = 10, n = 4: k_i = ((round(k + 2.5 i) - 1) mod 10) + 1 -> spaced 2 or 3 apart mod 10
    valid = torch.ones(50, 10, dtype=torch.bool)
    counts = do.count_masks(valid, 4, generator=torch.Generator().manual_seed(1)).meta["counts"]
    k = counts[:, 0]
    for i in range(4):
        expect = torch.remainder(torch.round(k.double() + 2.5 * i) - 1, 10) + 1
        assert torch.equal(counts[:, i], expect.long())
    assert bool((counts.sort(-1).values.diff(dim=-1) > 0).all())  # distinct


def test_round_ties_to_even_as_torch_round() -> None:
    # L = 4, n = 8: offsets 0.5 i; k + 0.5 rounds to even (k = 1 -> 1.5 -> 2, k = 2 -> 2.5 -> 2)
    valid = torch.ones(200, 4, dtype=torch.bool)
    counts = do.count_masks(valid, 8, generator=torch.Generator().manual_seed(0)).meta["counts"]
    k = counts[:, 0]
    expect = torch.remainder(torch.round(k.double() + 0.5) - 1, 4) + 1
    assert torch.equal(counts[:, 1], expect.long())


def test_espo_masks_across_batch_stratification_and_complement() -> None:
    # B = 4 rows of L = 7: x_b = round(k + b * 8 / 4) mod 8 = k, k+2, k+4, k+6 (mod 8)
    valid = torch.ones(4, 7, dtype=torch.bool)
    plan, comp = do.espo_masks(valid, 3, generator=torch.Generator().manual_seed(5))
    x = plan.meta["counts"]
    assert torch.equal(torch.remainder(x - x[:1], 8), torch.tensor([[0], [2], [4], [6]]).expand(4, 3))
    assert bool(((plan.mask ^ comp.mask) == valid[:, None, :]).all())  # partition
    # denominators: x / 8 + (7 - x) / 8 = 7 / 8 = L / (L + 1)
    assert torch.allclose(plan.p_mask[..., 0] + comp.p_mask[..., 0], torch.full((4, 3), 7 / 8))
    assert bool((comp.mask.sum(-1) == 7 - x).all())


def test_espo_masks_unequal_lengths_fall_back_to_independent_draws() -> None:
    valid = torch.tensor([[True] * 5 + [False], [True] * 6])
    plan, _ = do.espo_masks(valid, 200, generator=torch.Generator().manual_seed(0))
    x = plan.meta["counts"]
    assert bool((x[0] <= 5).all()) and bool((x[1] <= 6).all()) and int(x.min()) == 0


def test_count_masks_bad_options() -> None:
    valid = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="support"):
        do.count_masks(valid, 1, support="1..N", generator=torch.Generator())
    with pytest.raises(ValueError, match="num_samples"):
        do.count_masks(valid, 0, generator=torch.Generator())
    with pytest.raises(ValueError, match="bool"):
        do.count_masks(valid.long(), 1, generator=torch.Generator())

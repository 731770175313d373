"""Tests for dllm_objectives.plan."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dllm_objectives as do


def test_apply_mask_hand_case() -> None:
    # copy 0 masks position 1, copy 1 masks positions 0 and 2; mask id 9
    ids = torch.tensor([[5, 6, 7]])
    mask = torch.tensor([[[False, True, False], [True, False, True]]])
    plan = do.MaskPlan(mask=mask, p_mask=mask.float())
    assert do.apply_mask(ids, plan, 9).tolist() == [[[5, 9, 7], [9, 6, 9]]]


def test_mask_plan_is_frozen_and_validated() -> None:
    plan = do.MaskPlan(mask=torch.zeros(1, 1, 2, dtype=torch.bool), p_mask=torch.zeros(1, 1, 2))
    assert plan.meta == {} and plan.num_samples == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mask = plan.mask  # type: ignore[misc]
    with pytest.raises(ValueError, match="bool"):
        do.MaskPlan(mask=torch.zeros(1, 1, 2), p_mask=torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="p_mask"):
        do.MaskPlan(mask=torch.zeros(1, 1, 2, dtype=torch.bool), p_mask=torch.zeros(1, 2))


def test_apply_mask_rejects_shape_mismatch() -> None:
    plan = do.MaskPlan(mask=torch.zeros(1, 1, 2, dtype=torch.bool), p_mask=torch.zeros(1, 1, 2))
    with pytest.raises(ValueError, match="input_ids"):
        do.apply_mask(torch.zeros(1, 3, dtype=torch.long), plan, 0)

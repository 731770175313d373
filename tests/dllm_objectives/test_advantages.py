"""Tests for dllm_objectives.advantages (docs/algorithms.md#advantages)."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def test_grpo_hand_case() -> None:
    # group 0: scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    #   -> advantages +-0.5 / (0.57735 + 1e-6) = +-0.866024
    # group 7: scores 2, 4 -> mean 3, std sqrt(2 / 1) = 1.41421 -> -+0.707106
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    gid = torch.tensor([0, 0, 0, 0, 7, 7])
    adv = do.grpo_advantages(scores, gid)
    expect = [0.866024, -0.866024, -0.866024, 0.866024, -0.707106, 0.707106]
    assert adv.tolist() == pytest.approx(expect, abs=1e-5)
    # Dr.GRPO: no std division -> +-0.5 and -+1
    dr = do.grpo_advantages(scores, gid, norm_by_std=False)
    assert dr.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.0, 1.0])
    # biased std for group 7 is 1 -> -+1 (up to eps)
    assert do.grpo_advantages(scores, gid, unbiased_std=False)[4].item() == pytest.approx(-1.0, abs=1e-5)


def test_grpo_singletons_and_equal_groups() -> None:
    scores = torch.tensor([3.0, 1.0, 1.0])
    gid = torch.tensor([5, 6, 6])
    # singleton group 5: canonical advantage 0; verl parity: mean 0, std 1 -> 3 / (1 + 1e-6)
    assert do.grpo_advantages(scores, gid).tolist() == [0.0, 0.0, 0.0]
    raw = do.grpo_advantages(scores, gid, singleton="raw").tolist()
    assert raw == pytest.approx([3.0 / (1 + 1e-6), 0.0, 0.0], abs=1e-5)
    assert do.grpo_advantages(scores, gid, singleton="raw", norm_by_std=False)[0].item() == 3.0
    with pytest.raises(ValueError, match="singleton"):
        do.grpo_advantages(scores, gid, singleton="one")


def test_grpo_groups_zero_mean_unit_std_property() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, generator=g)
    gid = torch.arange(40) // 8
    adv = do.grpo_advantages(scores, gid, eps=0.0)
    for k in range(5):
        a = adv[gid == k]
        assert abs(a.mean().item()) < 1e-5 and a.std().item() == pytest.approx(1.0, abs=1e-5)


def test_grpo_accepts_step_matrix() -> None:
    # two columns normalised independently across the group
    scores = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    adv = do.grpo_advantages(scores, torch.tensor([0, 0]), norm_by_std=False)
    assert adv.tolist() == [[-1.0, 0.0], [1.0, 0.0]]


def test_rloo_is_leave_one_out_difference() -> None:
    # scores 1, 2, 6: A_0 = 1 - (2 + 6) / 2 = -3; A_1 = 2 - 3.5 = -1.5; A_2 = 6 - 1.5 = 4.5
    scores = torch.tensor([1.0, 2.0, 6.0, 9.0])
    gid = torch.tensor([0, 0, 0, 1])
    assert do.rloo_advantages(scores, gid).tolist() == pytest.approx([-3.0, -1.5, 4.5, 0.0])
    assert do.rloo_advantages(scores, gid, singleton="raw")[3].item() == 9.0


def test_sequence_advantages_masked_mean() -> None:
    # row 0: (2 + 4) / 2 = 3; row 1 has no valid token -> 0
    a = torch.tensor([[2.0, 4.0, 100.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[True, True, False], [False, False, False]])
    assert do.sequence_advantages(a, m).tolist() == [3.0, 0.0]


def test_group_ids_shape_error() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        do.grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))

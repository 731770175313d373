"""Tests for dllm_objectives.tree (d-TreeRPO, docs/algorithms.md#d-treerpo)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do

NAN = float("nan")


def _tree() -> tuple[torch.Tensor, torch.Tensor]:
    # 0 root; 1, 2 children of 0; leaves 3, 4 under 1 and 5, 6 under 2
    parent = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
    leaves = torch.tensor([NAN, NAN, NAN, 1.0, 0.0, 1.0, 1.0])
    return parent, leaves


def test_tree_values_and_local_advantages_hand_case() -> None:
    parent, leaves = _tree()
    v = do.tree_values(parent, leaves)
    # node 1 = mean(1, 0) = 0.5; node 2 = 1; root = 0.75
    assert v.tolist() == pytest.approx([0.75, 0.5, 1.0, 1.0, 0.0, 1.0, 1.0])
    a = do.tree_local_advantages(parent, v)
    # A_1 = 0.5 - 1 = -0.5, A_2 = 0.5, A_3 = 1, A_4 = -1, A_5 = A_6 = 0
    assert a.tolist() == pytest.approx([0.0, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0])


def test_sibling_advantages_sum_to_zero() -> None:
    parent = torch.tensor([-1, 0, 0, 0, 0])
    v = torch.tensor([0.0, 0.3, 0.9, 0.1, 0.5])
    a = do.tree_local_advantages(parent, v)
    assert abs(a[1:].sum().item()) < 1e-6


def test_tree_policy_loss_identity_and_kl() -> None:
    # -mean_seg A at the old policy, seq-mean-token-mean; KL zero when ref = policy
    lp = torch.zeros(2, 3)
    active = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, 3.0])
    loss, met = do.tree_policy_loss(lp, lp, adv, active, ref_logp=lp, kl_coef=0.01)
    assert loss.item() == pytest.approx(-2.0) and met["kl"].item() == 0.0


def test_tree_active_positions_and_parity_filter() -> None:
    # mask id 9, eos 0: child eos at position 2 -> positions > 2 inactive
    parent = torch.tensor([[9, 9, 9, 9, 5]])
    child = torch.tensor([[4, 9, 0, 3, 5]])
    assert do.tree_active_positions(parent, child, 9, 0).tolist() == [[True, False, True, False, False]]
    old = torch.tensor([[0.0, -1.0, -1.0, -1.0, -1.0]])
    assert do.tree_active_positions(parent, child, 9, 0, old_logp=old).tolist() == [[False, False, True, False, False]]


def test_self_distill_schedule_endpoints() -> None:
    lam0, tau0 = do.tree_self_distill_schedule(0.0)
    lam1, tau1 = do.tree_self_distill_schedule(1.0)
    assert lam0 == 0.0 and tau0 == 2.0
    assert lam1 == pytest.approx(3e-3) and tau1 == 1e-6


def test_self_distill_kl_point_mass_and_no_positive_member() -> None:
    # one group, 2 members, R = 1, V = 3; both positive members pick token 1
    tokens = torch.tensor([[[1], [1]]])
    active = torch.ones(1, 2, 1, dtype=torch.bool)
    sure = torch.log(torch.tensor([[[1e-12, 1.0, 1e-12]]]))
    kl, used = do.tree_self_distill_kl(sure, tokens, torch.tensor([[1.0, 2.0]]), active, tau=1.0)
    assert bool(used.all()) and abs(kl.item()) < 1e-6  # point mass predicted with p = 1
    unsure = torch.log(torch.tensor([[[0.25, 0.5, 0.25]]]))
    kl, _ = do.tree_self_distill_kl(unsure, tokens, torch.tensor([[1.0, 2.0]]), active, tau=1.0)
    assert kl.item() == pytest.approx(math.log(2.0), abs=1e-6)  # 1 * (log 1 - log 0.5)
    kl, used = do.tree_self_distill_kl(unsure, tokens, torch.tensor([[-1.0, 0.0]]), active, tau=1.0)
    assert not bool(used.any()) and kl.item() == 0.0

"""Tests for dllm_objectives.masking and the global-RNG guarantee of every sampler."""

from __future__ import annotations

import random

import pytest
import torch

import dllm_objectives as do


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    # 2 rows of 8: left-padded prompt (cols 0-3), right-padded response (cols 4-7)
    prompt = torch.tensor([[False, True, True, True, False, False, False, False],
                           [True, True, True, True, False, False, False, False]])
    resp = torch.tensor([[False, False, False, False, True, True, True, False],
                         [False, False, False, False, True, True, True, True]])
    return prompt, resp


def test_one_step_masks_structure_and_rate() -> None:
    prompt, resp = _rows()
    prompt, resp = prompt.repeat(500, 1), resp.repeat(500, 1)
    plan = do.one_step_masks(prompt, resp, generator=torch.Generator().manual_seed(0))
    assert plan.mask.shape == (1000, 1, 8)
    m = plan.mask[:, 0]
    assert bool(m[resp].all())  # every valid response position masked
    assert not bool(m[~prompt & ~resp].any())  # padding never
    rate = m[prompt].float().mean().item()
    # 3500 Bernoulli(0.15): std = sqrt(.15 * .85 / 3500) = 0.006
    assert abs(rate - 0.15) < 5 * 0.006
    assert plan.p_mask[:, 0][resp].eq(1).all() and plan.p_mask[:, 0][prompt].eq(0.15).all()


def test_one_step_masks_rejects_overlap() -> None:
    prompt, resp = _rows()
    with pytest.raises(ValueError, match="overlap"):
        do.one_step_masks(prompt | resp, resp, generator=torch.Generator())


def test_coupled_masks_partition_valid_positions() -> None:
    _, resp = _rows()
    plan = do.coupled_masks(resp, generator=torch.Generator().manual_seed(0))
    a, b = plan.mask[:, 0], plan.mask[:, 1]
    assert not bool((a & b).any()) and bool(((a | b) == resp).all())
    t = plan.meta["t"]
    assert bool(((t[:, 0] >= 0.2) & (t[:, 0] <= 0.8)).all())
    assert torch.allclose(t[:, 0] + t[:, 1], torch.ones(2))
    assert torch.allclose(plan.p_mask[:, 0][resp], t[:, :1].expand(2, 8)[resp])
    full = do.coupled_masks(resp, include_full=True, generator=torch.Generator().manual_seed(0))
    assert full.num_samples == 3 and bool((full.mask[:, 0] == resp).all())
    assert bool((full.mask[:, 1:] == plan.mask).all())


def test_coupled_fixed_seed_parity_reproduces_dare_quirk() -> None:
    # DARE: set_seed(42); t = random.uniform(0.2, 0.8); u = torch.rand((1, l)) -> identical for
    # every row and every call (docs/algorithms.md#quirk-coupled-seed).
    # t = 0.2 + 0.6 * 0.6394267984578837 = 0.58366
    _, resp = _rows()
    resp = torch.ones(3, 8, dtype=torch.bool)
    p1 = do.coupled_masks(resp, fixed_seed=42, generator=torch.Generator().manual_seed(1))
    p2 = do.coupled_masks(resp, fixed_seed=42, generator=torch.Generator().manual_seed(2))
    assert p1.meta["t"][0, 0].item() == pytest.approx(0.5836560790747302, abs=1e-6)
    assert bool((p1.mask == p2.mask).all()) and bool((p1.mask[0] == p1.mask[1]).all())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)
        u = torch.rand((1, 8))
    assert bool((p1.mask[0, 0] == (u[0] < p1.meta["t"][0, 0])).all())
    # canonical: rows differ
    c = do.coupled_masks(torch.ones(64, 8, dtype=torch.bool), generator=torch.Generator().manual_seed(0))
    assert not bool((c.mask == c.mask[:1]).all())


def test_iid_masks_rate_eps_and_range() -> None:
    valid = torch.ones(400, 16, dtype=torch.bool)
    valid[:, 12:] = False
    plan = do.iid_masks(valid, 2, t_min=0.3, t_max=0.8, generator=torch.Generator().manual_seed(0))
    t = plan.meta["t"]
    assert bool(((t >= 0.3) & (t <= 0.8)).all()) and not bool(plan.mask[:, :, 12:].any())
    # realised rate per copy tracks t: mean over copies of (|S| / 12 - t) ~ 0
    diff = plan.mask[:, :, :12].float().mean(-1) - t
    assert abs(diff.mean().item()) < 5 * diff.std().item() / 800**0.5
    floored = do.iid_masks(valid, 1, eps=0.5, generator=torch.Generator().manual_seed(0))
    assert bool((floored.meta["t"] >= 0.5).all())


def test_iid_masks_antithetic_pairs_are_complements() -> None:
    valid = torch.tensor([[True, True, True, False]] * 5)
    plan = do.iid_masks(valid, 4, antithetic=True, generator=torch.Generator().manual_seed(0))
    for k in (0, 2):
        a, b = plan.mask[:, k], plan.mask[:, k + 1]
        assert not bool((a & b).any()) and bool(((a | b) == valid).all())
        assert torch.allclose(plan.meta["t"][:, k] + plan.meta["t"][:, k + 1], torch.ones(5))
    with pytest.raises(ValueError, match="even"):
        do.iid_masks(valid, 3, antithetic=True, generator=torch.Generator())


def test_complement_plan_of_ratio_plan() -> None:
    valid = torch.tensor([[True, True, False]])
    plan = do.iid_masks(valid, 1, generator=torch.Generator().manual_seed(3))
    comp = do.complement_plan(plan, valid)
    assert bool(((plan.mask | comp.mask)[0, 0] == valid[0]).all())
    assert torch.allclose(comp.meta["t"], 1 - plan.meta["t"])
    bare = do.MaskPlan(mask=plan.mask, p_mask=plan.p_mask)
    with pytest.raises(ValueError, match="meta"):
        do.complement_plan(bare, valid)


def test_samplers_are_deterministic_given_generator() -> None:
    _, resp = _rows()
    a = do.iid_masks(resp, 3, generator=torch.Generator().manual_seed(7))
    b = do.iid_masks(resp, 3, generator=torch.Generator().manual_seed(7))
    assert bool((a.mask == b.mask).all()) and torch.equal(a.meta["t"], b.meta["t"])


def test_every_sampler_leaves_global_rng_untouched() -> None:
    prompt, resp = _rows()
    ids = do.block_ids(prompt | resp, 2)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    g = torch.Generator().manual_seed(0)
    do.one_step_masks(prompt, resp, generator=g)
    do.coupled_masks(resp, generator=g)
    do.coupled_masks(resp, fixed_seed=42, generator=g)
    do.iid_masks(resp, 2, antithetic=True, generator=g)
    do.count_masks(resp, 3, generator=g)
    do.espo_masks(resp, 2, generator=g)
    do.random_subset(resp, torch.ones(2, 1, dtype=torch.long), generator=g)
    do.block_count_masks(resp, ids, 2, generator=g)
    do.spg_block_masks(prompt, resp, 2, response_start=4, block_length=2, generator=g)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state

"""Coupled-GRPO's `fixed_mask_seed`: DARE's masks, bit for bit on CPU, against a transcription of
its mask draw (yjyddq/DARE at 83ae8a3, verl/trainer/ppo/dllm_core_algos.py:919-959, called once
per row by verl/workers/dllm_fsdp_workers.py:1178-1190 with the default seed 42)."""

from __future__ import annotations

import random

import torch

import dllm_algorithms as da
from dllm_train import sequence_inputs
from tests.dllm_algorithms.cases import prepared_batch
from tests.tiny_rl import tiny_model

MASK = -1  # a stand-in mask id: the draw never reads the tokens


def _dare_forward_process_coupled_grpo(batch: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                                       seed: int = 42) -> tuple[torch.Tensor, torch.Tensor]:
    """_forward_process_coupled_grpo (the mask indices and p_mask of its three copies), with
    accelerate's set_seed(seed) reduced to the Python and torch CPU seeds it sets."""
    random.seed(seed)
    torch.manual_seed(seed)
    b, l = batch.shape
    prompt_index = attention_mask.clone().bool()
    prompt_index[prompt_len:] = False
    prompt_index = prompt_index.unsqueeze(0).repeat(b, 1)
    mask_ratio = random.uniform(0.2, 0.8)
    t_p = torch.ones((b, l), device=batch.device) * mask_ratio
    random_matrix = torch.rand((b, l), device=batch.device)
    mask_indices_full = ~prompt_index
    mask_indices_tp = ~prompt_index & (random_matrix < t_p)
    mask_indices_comp_tp = ~prompt_index & (random_matrix > t_p)
    mask_indices = torch.cat([mask_indices_full, mask_indices_tp, mask_indices_comp_tp], dim=0)
    p_mask = torch.cat([mask_indices_full.float(), mask_indices_tp.float() * t_p,
                        mask_indices_comp_tp.float() * (1. - t_p)], dim=0)
    return mask_indices, p_mask


def _plan(seed: int | None, batch_seed: int = 0) -> tuple[object, object]:
    from tests.dllm_algorithms import cases

    saved = cases.ALGORITHMS["CoupledGRPO"]
    cases.ALGORITHMS["CoupledGRPO"] = da.CoupledGRPO(fixed_mask_seed=seed)
    try:
        _, prepared, _ = prepared_batch("CoupledGRPO", "llada", tiny_model("llada"), seed=batch_seed)
    finally:
        cases.ALGORITHMS["CoupledGRPO"] = saved
    return prepared.batch, prepared.data


def test_fixed_mask_seed_reproduces_dare_masks_bit_for_bit() -> None:
    batch, plan = _plan(42)
    ids, attn, _, response_valid = sequence_inputs(batch.rollout)  # type: ignore[attr-defined]
    prompt_len = batch.rollout.prompt_ids.shape[1]  # type: ignore[attr-defined]
    with torch.random.fork_rng(devices=[]):
        state = random.getstate()
        try:
            for i in range(ids.shape[0]):  # DARE draws each row on its own, re-seeding every time
                mask, p_mask = _dare_forward_process_coupled_grpo(ids[i:i + 1], attn[i].long(), prompt_len)
                valid = response_valid[i]  # DARE packs the attended tokens: only these reach the model
                for c in range(3):
                    assert torch.equal(plan.mask[i, c][valid], mask[c][valid]), (i, c)  # type: ignore[attr-defined]
                    # DARE's p_mask is the ratio at masked positions (0 elsewhere); ours the ratio at every valid one
                    hit = valid & mask[c]
                    assert torch.equal(plan.p_mask[i, c][hit], p_mask[c][hit]), (i, c)  # type: ignore[attr-defined]
        finally:
            random.setstate(state)


def test_fixed_mask_seed_is_one_draw_for_every_row_and_step_and_off_by_default() -> None:
    assert da.CoupledGRPO().fixed_mask_seed is None
    (batch_a, a), (batch_b, b) = _plan(42, batch_seed=0), _plan(42, batch_seed=1)  # two steps' batches
    t = a.meta["t"][:, 1]  # type: ignore[attr-defined]
    assert bool((t == t[0]).all()) and torch.equal(t, b.meta["t"][:, 1])  # type: ignore[attr-defined]
    for batch, plan in ((batch_a, a), (batch_b, b)):
        valid = sequence_inputs(batch.rollout)[3]  # type: ignore[attr-defined]
        u = torch.rand((valid.shape[1],), generator=torch.Generator().manual_seed(42))
        assert torch.equal(plan.mask[:, 1], valid & (u < t[0]))  # type: ignore[attr-defined]
    _, c = _plan(None, batch_seed=0)
    t_c = c.meta["t"][:, 1]  # type: ignore[attr-defined]
    assert not bool((t_c == t_c[0]).all())  # default: a fresh t per row

"""Tests for dllm_objectives.block (docs/algorithms.md#block-diffusion, #ebpo masking M6)."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def test_block_ids_global_and_response_origin() -> None:
    # row: pad, 3 prompt tokens, 4 response tokens, pad; block size 2
    valid = torch.tensor([[False, True, True, True, True, True, True, True, False]])
    prompt = torch.tensor([[False, True, True, True, False, False, False, False, False]])
    # global: compact positions 0..6 -> blocks 0 0 1 1 2 2 3
    assert do.block_ids(valid, 2).tolist() == [[-1, 0, 0, 1, 1, 2, 2, 3, -1]]
    # response origin: prompt P = 3 -> 2 blocks (0 0 1); response starts block 2: 2 2 3 3
    out = do.block_ids(valid, 2, origin="response", prompt_valid=prompt)
    assert out.tolist() == [[-1, 0, 0, 1, 2, 2, 3, 3, -1]]
    with pytest.raises(ValueError, match="prompt_valid"):
        do.block_ids(valid, 2, origin="response")
    with pytest.raises(ValueError, match="origin"):
        do.block_ids(valid, 2, origin="local")


def test_bd3lm_mask_hand_case() -> None:
    # n = 3 with blocks [0, 0, 1]; layout [z0 z1 z2 | x0 x1 x2]
    ids = torch.tensor([[0, 0, 1]])
    m = do.bd3lm_attention_mask(ids)[0].int().tolist()
    assert m == [
        [1, 1, 0, 0, 0, 0],  # z0: own block noisy only
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 0],  # z2: own noisy block + clean earlier block 0
        [0, 0, 0, 1, 1, 0],  # x0: clean block-causal
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]
    # padding (-1) is never visible nor attends
    pad = do.bd3lm_attention_mask(torch.tensor([[0, -1]]))[0]
    assert not bool(pad[:, 1].any()) and not bool(pad[1].any()) and not bool(pad[:, 3].any())


def test_block_count_masks_invariants() -> None:
    # prompt 3 tokens, response 7 tokens, block size 4, global origin: response blocks 0 (1 token),
    # 1 (4 tokens), 2 (2 tokens)
    valid = torch.ones(2, 10, dtype=torch.bool)
    resp = torch.zeros(2, 10, dtype=torch.bool)
    resp[:, 3:] = True
    ids = do.block_ids(valid, 4)
    n = 5
    plan = do.block_count_masks(resp, ids, n, generator=torch.Generator().manual_seed(0))
    assert not bool((plan.mask & ~resp[:, None, :]).any())  # only response tokens
    sizes = plan.meta["block_sizes"]
    assert sizes.tolist() == [[1, 4, 2], [1, 4, 2]]
    counts = plan.meta["counts"]
    for blk in range(3):
        in_blk = (ids == blk) & resp
        realised = (plan.mask & in_blk[:, None, :]).sum(-1)
        assert torch.equal(realised, counts[:, :, blk])
        assert bool(((counts[:, :, blk] >= 1) & (counts[:, :, blk] <= sizes[0, blk])).all())
    # p_mask = k / n_b at response positions of the block
    assert torch.allclose(plan.p_mask[:, :, 4], counts[:, :, 1] / 4.0)


def test_block_count_levels_are_stratified() -> None:
    # one block of 1000 tokens, N = 4 rows -> C = 4 levels spaced 1/4: counts floor(u n) + 1
    resp = torch.ones(1, 1000, dtype=torch.bool)
    ids = torch.zeros(1, 1000, dtype=torch.long)
    counts = do.block_count_masks(resp, ids, 4, generator=torch.Generator().manual_seed(1)).meta["counts"][0, :, 0]
    gaps = torch.remainder(counts.diff().double(), 1000)
    assert bool(((gaps - 250).abs() <= 1).all())


def test_composite_block_elbo_independent_denoiser_is_unbiased() -> None:
    # for an independent-token denoiser every block term is unbiased for sum_j log q_j
    lq = torch.tensor([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    resp = torch.ones(3000, 6, dtype=torch.bool)
    ids = do.block_ids(resp, 4)
    plan = do.block_count_masks(resp, ids, 2, generator=torch.Generator().manual_seed(2))
    est = do.composite_block_elbo(lq.expand(plan.mask.shape), plan)
    se = est.std().item() / 3000**0.5
    assert abs(est.mean().item() - lq.sum().item()) < 5 * se

"""Block-diffusion helpers: block ids, the BD3LM visibility predicate, EBPO per-block counts.

See docs/algorithms.md#block-diffusion (SDAR, LLaDA2.x) and #ebpo (EBPO masking M6). The library
only describes the mask;
building a flex-attention ``BlockMask`` or running the ``[z; x]`` forward is the model's job.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_same_shape, uniform, uniform64
from .plan import MaskPlan

__all__ = ["block_ids", "bd3lm_visible", "bd3lm_attention_mask", "block_count_masks"]

_ORIGINS = ("global", "response")


def block_ids(
    valid: Tensor,
    block_size: int,
    *,
    origin: str = "global",
    prompt_valid: Tensor | None = None,
) -> Tensor:
    """Block index of every position on the compact (padding-removed) sequence.

    ``origin="global"`` (the only one used for RL): ``floor(compact position / block_size)``
    counted from the first valid token, so prompt and response share one grid.
    ``origin="response"``: the prompt takes ``ceil(P / block_size)`` blocks and the response
    starts a fresh block.

    Args:
        valid: bool ``[B, S]`` valid (non-padding) positions.
        block_size: tokens per block (> 0).
        origin: ``"global"`` or ``"response"``.
        prompt_valid: bool ``[B, S]``, required for ``origin="response"``.

    Returns:
        long ``[B, S]``, -1 on padding.
    """
    check_bool("valid", valid, 2)
    check_choice("origin", origin, _ORIGINS)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}.")
    pos = valid.long().cumsum(-1) - 1
    if origin == "global":
        ids = torch.div(pos, block_size, rounding_mode="floor")
    else:
        if prompt_valid is None:
            raise ValueError("origin='response' needs prompt_valid (bool [B, S]).")
        check_same_shape(valid=valid, prompt_valid=prompt_valid)
        p_len = (prompt_valid & valid).long().sum(-1, keepdim=True)
        prompt_blocks = torch.div(p_len + block_size - 1, block_size, rounding_mode="floor")
        resp_pos = pos - p_len
        ids = torch.where(
            prompt_valid,
            torch.div(pos, block_size, rounding_mode="floor"),
            prompt_blocks + torch.div(resp_pos, block_size, rounding_mode="floor"),
        )
    return torch.where(valid, ids, torch.full_like(ids, -1))


def bd3lm_visible(q_idx: Tensor, kv_idx: Tensor, row_block_ids: Tensor) -> Tensor:
    """BD3LM visibility on the ``[z; x]`` layout of length ``2n`` (Arriola et al. 2025).

    Noisy -> noisy within the same block; noisy -> clean only to strictly earlier blocks;
    clean -> clean to the same or earlier blocks; clean -> noisy never; padding never. Usable
    as a flex-attention ``mask_mod`` body: ``lambda b, h, q, k: bd3lm_visible(q, k, ids[b])``.

    Args:
        q_idx, kv_idx: integer index tensors in ``[0, 2n)`` (broadcastable).
        row_block_ids: long ``[n]`` block ids of one row (-1 on padding).

    Returns:
        bool tensor of the broadcast shape.
    """
    n = row_block_ids.shape[-1]
    q_noisy, k_noisy = q_idx < n, kv_idx < n
    qb, kb = row_block_ids[q_idx % n], row_block_ids[kv_idx % n]
    real = (qb >= 0) & (kb >= 0)
    noisy_noisy = q_noisy & k_noisy & (qb == kb)
    noisy_clean = q_noisy & ~k_noisy & (kb < qb)
    clean_clean = ~q_noisy & ~k_noisy & (kb <= qb)
    return real & (noisy_noisy | noisy_clean | clean_clean)


def bd3lm_attention_mask(ids: Tensor) -> Tensor:
    """Dense boolean BD3LM mask ``[B, 2n, 2n]`` (True = may attend) from block ids ``[B, n]``."""
    n = ids.shape[-1]
    idx = torch.arange(2 * n, device=ids.device)
    return torch.stack([bd3lm_visible(idx[:, None], idx[None, :], row) for row in ids])


def _cell_counts(sizes: Tensor, num_samples: int, generator: torch.Generator) -> Tensor:
    """Stratified per-(row, block) counts ``k = min(floor(u n_b) + 1, n_b)``, ``[B, N, K]``."""
    b, k = sizes.shape
    present = sizes > 0
    rank = present.long().cumsum(-1) - 1  # rank of the block among present blocks
    n_present = present.long().sum(-1, keepdim=True).clamp_min(1)  # [B, 1]
    cells = num_samples * n_present  # C per sequence
    row = torch.arange(num_samples, device=sizes.device)[None, :, None]
    c = row * n_present[:, :, None] + rank[:, None, :]  # row-major cell index [B, N, K]
    u0 = uniform64((b, 1, 1), generator, sizes)
    u = torch.remainder(u0 + c.double() / cells[:, :, None].double(), 1.0)
    size = sizes[:, None, :].double()
    counts = torch.minimum(torch.floor(u * size) + 1, size).long()
    return torch.where(present[:, None, :], counts, torch.zeros_like(counts))


def block_count_masks(
    response_valid: Tensor, ids: Tensor, num_samples: int, *, generator: torch.Generator
) -> MaskPlan:
    """EBPO per-block count masking M6 (LLaDA2.1, arXiv 2602.08676; docs/algorithms.md#ebpo).

    Every block overlapping the response gets, in every copy, its own count
    ``k = min(floor(u n_b) + 1, n_b)`` of masked response positions (uniform subset), with the
    ``C = N * blocks`` levels ``u_c = (u_0 + c / C) mod 1`` stratified row-major;
    ``p_mask = k / n_b`` with ``n_b`` the block's response tokens.

    Args:
        response_valid: bool ``[B, S]`` valid response positions (only these are masked).
        ids: long ``[B, S]`` block ids (:func:`block_ids`, -1 on padding).
        num_samples: ``N`` copies (``mc_num``).
        generator: source of randomness.

    Returns:
        A plan with ``meta["counts"]`` ``[B, N, K]`` and ``meta["block_sizes"]`` ``[B, K]``.
    """
    check_bool("response_valid", response_valid, 2)
    check_same_shape(response_valid=response_valid, ids=ids)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    b, s = ids.shape
    k = int(ids.max().item()) + 1 if ids.numel() else 1
    blk = torch.where(response_valid, ids, torch.zeros_like(ids)).clamp_min(0)
    sizes = torch.zeros((b, k), dtype=torch.long, device=ids.device)
    sizes.scatter_add_(1, blk, response_valid.long())
    counts = _cell_counts(sizes, num_samples, generator)
    # rank every response position within its block by a random score
    score = uniform((b, num_samples, s), generator, ids).double()
    last = torch.full_like(score, 4.0 * k + 8)  # padding sorts after every block
    key = torch.where(response_valid[:, None, :], blk[:, None, :] * 4.0 + score, last)
    order_rank = key.argsort(-1).argsort(-1)
    start = (sizes.cumsum(-1) - sizes)[:, None, :].expand(-1, num_samples, -1)
    blk_n = blk[:, None, :].expand(-1, num_samples, -1)
    within = order_rank - start.gather(2, blk_n)
    k_pos = counts.gather(2, blk_n)
    mask = response_valid[:, None, :] & (within < k_pos)
    n_pos = sizes[:, None, :].expand(-1, num_samples, -1).gather(2, blk_n)
    ratio = k_pos.float() / n_pos.clamp_min(1).float()
    p_mask = torch.where(response_valid[:, None, :], ratio, torch.zeros_like(ratio))
    return MaskPlan(mask=mask, p_mask=p_mask, meta={"counts": counts, "block_sizes": sizes})

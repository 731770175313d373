"""Which key tiles each query tile of a BD3LM row can see: the tile schedule of `bd3lm_attention`.

The BD3LM training layout (Arriola et al., arXiv 2503.09573; `dllm_models.attention.bd3lm_mask`)
packs segments [x_0 ; x_t^1 ; ... ; x_t^k] (or [x_t ; x_0]) along one row. The keys a query sees
are at most two contiguous runs of positions:

- the clean prefix: the clean keys of its segment up to the end of its block (a clean query) or
  up to the start of its block (a noisy query) -- the clean copy of a segment is contiguous and
  its block ids ascend, so these keys are one run [clean start, clean start + count);
- its own block (a noisy query): the run of positions sharing its (segment, copy, block).

So the visible set is computed analytically per query as two intervals, never as a dense
Lq x Lk mask. A query tile's key tiles are the union of its queries' intervals, cut to tiles; a
key tile is *full* for a query tile when every query of the tile covers all its keys (no mask is
evaluated there), *partial* when some query sees some key (the kernel masks element-wise with
the per-position ids). Difference arrays over [query tiles, key tiles] turn the 2 N intervals
into both tables in O(N + Tq Tk). This is the block-sparse scheduling of FlexAttention's
`BlockMask` (partial and full kv-block lists per query block, Dong et al., arXiv 2412.05496) and
of FlashAttention-3/4's causal and varlen tile bounds (Shah et al., arXiv 2407.08608), made
exact for this mask: a tile is visited iff some query of it sees some key of it, and the list is
computed from the layout rather than by evaluating the mask over every tile. The backward walks
the transposed table (per key tile, the query tiles that see it), and tiles are launched
longest walk first (as FlashAttention-4's LPT tile scheduler orders causal tiles).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

_BIG = 1 << 30


class PositionIds(NamedTuple):
    """int32 [N] per-position ids the kernel masks with (see `position_ids`).

    Attributes:
        qseg: packed sequence of each position as a query.
        kseg: the same as a key, -1 on padded keys (never seen).
        blk: diffusion block.
        copy: 0 on the clean copy, 1 + the noisy copy's index elsewhere.
    """

    qseg: torch.Tensor
    kseg: torch.Tensor
    blk: torch.Tensor
    copy: torch.Tensor


class Schedule(NamedTuple):
    """Visited tiles: per query tile its key tiles (forward, dq), per key tile its query tiles (dk, dv).

    Attributes:
        q_num: int32 [Tq] number of key tiles of each query tile.
        q_idx: int32 [Tq, max(1, max q_num)] those key tiles, ascending (padding past q_num).
        q_full: int32 [Tq, same] 1 where the key tile is full (no element mask needed).
        k_num, k_idx, k_full: the same per key tile over query tiles.
        q_order, k_order: int32 tiles by descending work (q_num, k_num): program i serves tile
            order[i], so the longest walks start first and the short ones fill in behind them
            (longest-processing-time-first; a noisy copy's query tile walks its whole clean
            prefix, a noisy key tile is seen by one or two query tiles).
    """

    q_num: torch.Tensor
    q_idx: torch.Tensor
    q_full: torch.Tensor
    k_num: torch.Tensor
    k_idx: torch.Tensor
    k_full: torch.Tensor
    q_order: torch.Tensor
    k_order: torch.Tensor


def position_ids(mask: Any, n: int, device: torch.device) -> PositionIds:
    """Per-position ids of a BD3LM (or block-causal) `AttentionMask` over a packed row of n positions.

    Args:
        mask: a `dllm_models.attention.AttentionMask` with block_ids [1, n] (rule 'bd3lm' or
            'block_causal'), packed by cu_seqlens or one sequence (read by its fields: this
            module is imported by the attention module's backend, not the other way round).
        n: positions of the row.
        device: where the ids go.
    """
    assert mask.block_ids is not None
    blk = mask.block_ids[0, -n:].to(device=device, dtype=torch.int32)
    seg = mask.segment_ids(device)
    qseg = torch.zeros(n, dtype=torch.int32, device=device) if seg is None else seg[-n:].to(torch.int32)
    kseg = qseg
    if mask.key_padding is not None:
        real = mask.key_padding[0, -n:].to(device=device, dtype=torch.bool)
        kseg = torch.where(real, qseg, torch.full_like(qseg, -1))
    if mask.is_clean is None:  # block-causal: every position acts as a clean one
        copy = torch.zeros(n, dtype=torch.int32, device=device)
    else:
        clean = mask.is_clean[0, -n:].to(device=device, dtype=torch.bool)
        cp = (torch.zeros(n, dtype=torch.int32, device=device) if mask.copy_ids is None
              else mask.copy_ids[0, -n:].to(device=device, dtype=torch.int32))
        copy = torch.where(clean, torch.zeros_like(cp), cp + 1)
    return PositionIds(qseg.contiguous(), kseg.contiguous(), blk.contiguous(), copy.contiguous())


def visible_reference(ids: PositionIds) -> torch.Tensor:
    """bool [N, N] the mask the kernel computes element-wise (tests and small inputs only)."""
    qs, ks = ids.qseg[:, None], ids.kseg[None, :]
    qb, kb = ids.blk[:, None].long(), ids.blk[None, :].long()
    qc, kc = ids.copy[:, None], ids.copy[None, :]
    clean_key = (kc == 0) & (kb < qb + (qc == 0).long())
    own_block = (kc == qc) & (qc != 0) & (kb == qb)
    out: torch.Tensor = (ks == qs) & (clean_key | own_block)
    return out


def intervals(ids: PositionIds) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo1, hi1, lo2, hi2) long [N]: each query's clean prefix [lo1, hi1) and own block [lo2, hi2).

    The second run is empty for clean queries (their block is inside the prefix). Raises
    ValueError when a segment's clean copy is not one run with ascending blocks (not a layout of
    `bd3lm_mask`): the kernel's schedule would then miss keys.
    """
    n = ids.blk.numel()
    dev = ids.blk.device
    seg, blk, cp = ids.qseg.long(), ids.blk.long(), ids.copy.long()
    pos = torch.arange(n, device=dev)
    clean_at = (cp == 0).nonzero().squeeze(-1)
    key = seg[clean_at] * _BIG + blk[clean_at]
    if key.numel() > 1 and bool((key[1:] < key[:-1]).any()):
        raise ValueError("bd3lm_attention: the clean positions' (segment, block) ids must ascend along the row")
    first = torch.searchsorted(key, seg * _BIG)
    last = torch.searchsorted(key, seg * _BIG + blk + (cp == 0).long())
    count = last - first
    safe = first.clamp(max=max(clean_at.numel() - 1, 0))
    lo1 = clean_at[safe] if clean_at.numel() else torch.zeros_like(pos)
    seg_count = torch.searchsorted(key, seg * _BIG + _BIG - 1) - first
    seg_last = clean_at[(first + seg_count - 1).clamp(min=0, max=max(clean_at.numel() - 1, 0))] if clean_at.numel() \
        else lo1
    if bool(((seg_count > 0) & (seg_last - lo1 + 1 != seg_count)).any()):
        raise ValueError("bd3lm_attention: each segment's clean copy must be one contiguous run of positions")
    hi1 = lo1 + count
    # runs of constant (segment, copy, block): a noisy query's own block
    change = torch.ones(n, dtype=torch.bool, device=dev)
    change[1:] = (seg[1:] != seg[:-1]) | (cp[1:] != cp[:-1]) | (blk[1:] != blk[:-1])
    run = change.long().cumsum(0) - 1
    starts = pos[change]
    ends = torch.cat([starts[1:], torch.tensor([n], device=dev)])
    noisy = cp != 0
    lo2 = torch.where(noisy, starts[run], pos)
    hi2 = torch.where(noisy, ends[run], pos)
    return lo1, hi1, lo2, hi2


def _tile_table(lo: list[torch.Tensor], hi: list[torch.Tensor], n: int, tile_q: int, tile_k: int,
                whole: bool) -> torch.Tensor:
    """int32 [Tq, Tk]: per (query tile, key tile) how many of the tile's queries' intervals meet the
    key tile (`whole` False) or cover it entirely (`whole` True), by difference arrays."""
    tq, tk = -(-n // tile_q), -(-n // tile_k)
    dev = lo[0].device
    qtile = torch.arange(n, device=dev) // tile_q
    diff = torch.zeros(tq * (tk + 1), dtype=torch.int32, device=dev)
    for a, b in zip(lo, hi):
        if whole:  # key tiles entirely inside [a, b); the last key tile is never whole when ragged
            first = -(-a // tile_k)
            stop = torch.where(b >= n, torch.full_like(b, n // tile_k), b // tile_k)
        else:
            first = a // tile_k
            stop = -(-b // tile_k)
        ok = (b > a) & (stop > first)
        base = qtile * (tk + 1)
        one = ok.to(torch.int32)
        diff.index_add_(0, (base + first.clamp(max=tk))[ok], one[ok])
        diff.index_add_(0, (base + stop.clamp(max=tk))[ok], -one[ok])
    return diff.view(tq, tk + 1).cumsum(1)[:, :tk].to(torch.int32)


def _listed(sel: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(num [R], idx [R, W], full [R, W]) int32: the selected columns of each row first, ascending."""
    num = sel.sum(-1, dtype=torch.int32)
    width = max(1, int(num.max())) if num.numel() else 1
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)[:, :width]
    flags = torch.gather(full, 1, order) & torch.gather(sel, 1, order)
    return num, order.to(torch.int32).contiguous(), flags.to(torch.int32).contiguous()


def build_schedule(ids: PositionIds, tile_q: int, tile_k: int, *, padded_keys: bool) -> Schedule:
    """The visited tiles of a row (see the module doc).

    Args:
        ids: `position_ids` of the row.
        tile_q, tile_k: queries and keys per tile (the kernel's BLOCK_M / BLOCK_N).
        padded_keys: the mask hides some keys (key padding): no tile is then marked full.
    """
    n = ids.blk.numel()
    lo1, hi1, lo2, hi2 = intervals(ids)
    meets = _tile_table([lo1, lo2], [hi1, hi2], n, tile_q, tile_k, whole=False) > 0
    covers = _tile_table([lo1, lo2], [hi1, hi2], n, tile_q, tile_k, whole=True)
    per_tile = torch.full((meets.shape[0],), tile_q, dtype=torch.int32, device=meets.device)
    per_tile[-1] = n - tile_q * (meets.shape[0] - 1)
    # full: every query of a whole query tile covers the key tile
    full = (covers == per_tile[:, None]) & (per_tile[:, None] == tile_q) & meets
    if padded_keys:
        full = torch.zeros_like(full)
    q_num, q_idx, q_full = _listed(meets, full)
    k_num, k_idx, k_full = _listed(meets.T.contiguous(), full.T.contiguous())
    q_order = torch.argsort(q_num, descending=True, stable=True).to(torch.int32)
    k_order = torch.argsort(k_num, descending=True, stable=True).to(torch.int32)
    return Schedule(q_num, q_idx, q_full, k_num, k_idx, k_full, q_order, k_order)


def visited_pairs(schedule: Schedule, tile_q: int, tile_k: int) -> int:
    """Query-key pairs the kernel's forward computes (its tiles times their size), for FLOP counts."""
    return int(schedule.q_num.sum()) * tile_q * tile_k


__all__ = ["PositionIds", "Schedule", "build_schedule", "intervals", "position_ids", "visible_reference",
           "visited_pairs"]

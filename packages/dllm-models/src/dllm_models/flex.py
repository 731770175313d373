"""FlexAttention backend: a sparse `BlockMask` built tile by tile from an `AttentionMask`.

The block mask is derived from per-tile summaries (min/max of segment and block ids, which of
clean/noisy and real/padded positions a tile holds), so building it costs O((L / tile)^2) and
never materialises the dense Lq x Lk mask: tiles that no pair may attend are skipped, tiles where
every pair may attend are "full" (no mask_mod call), the rest evaluate the exact `mask_mod`
(the approach of DARE's `block_diffusion_utils.py`, docs/models.md#forward-contracts). Dong et al.,
"FlexAttention", arXiv 2412.05496.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from dllm_models.mask import AttentionMask

TILE = 128
_I32_MAX = torch.iinfo(torch.int32).max


class _Positions(NamedTuple):
    """Per key position tensors [B, Lpad] (Lpad: Lk rounded up to the tile)."""

    real: torch.Tensor
    seg: torch.Tensor
    blk: torch.Tensor
    clean: torch.Tensor
    copy: torch.Tensor


def _positions(mask: AttentionMask, batch: int, k_len: int, pad: int, device: torch.device) -> _Positions:
    def take(x: torch.Tensor | None, fill: int | bool, dtype: torch.dtype) -> torch.Tensor:
        if x is None:
            out = torch.full((batch, k_len), fill, dtype=dtype, device=device)
        else:
            out = x[:, -k_len:].to(device=device, dtype=dtype).expand(batch, k_len)
        return torch.nn.functional.pad(out, (0, pad - k_len), value=fill)

    seg = mask.segment_ids(device)
    seg_b = None if seg is None else seg[None, -k_len:]
    real = take(mask.key_padding, True, torch.bool)
    real[:, k_len:] = False  # positions past Lk never attend
    return _Positions(
        real=real.contiguous(),
        seg=take(seg_b, 0, torch.int32).contiguous(),
        blk=take(mask.block_ids, 0, torch.int32).contiguous(),
        clean=take(mask.is_clean, False, torch.bool).contiguous(),
        copy=take(mask.copy_ids, 0, torch.int32).contiguous(),
    )


def mask_mod_for(mask: AttentionMask, pos: _Positions, offset: int) -> Callable[..., torch.Tensor]:
    """Exact mask_mod(b, h, q_idx, kv_idx) of `mask`; queries sit at key position q_idx + offset.

    The captured tensors are int32 only and the rule is integer comparisons joined by `&` / `|`
    (no bool buffers, no `~`): key padding is folded into the key-side segment id (-1 on padded
    keys and on positions past Lk), and the BD3LM rule reads
    `(k clean & kb < qb + q clean) | (k noisy & q noisy & kb == qb & same copy)`.
    """
    real, seg, blk, clean, copy = pos
    kseg = torch.where(real, seg, torch.full_like(seg, -1)).to(torch.int32).contiguous()
    qseg = seg.to(torch.int32).contiguous()
    blk = blk.to(torch.int32).contiguous()
    cl = clean.to(torch.int32).contiguous()
    cp = copy.to(torch.int32).contiguous()
    copies = mask.copy_ids is not None
    rule = mask.rule

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> torch.Tensor:
        qi = q_idx + offset
        ok = kseg[b, kv_idx] == qseg[b, qi]
        if rule == "block_causal":
            ok = ok & (blk[b, kv_idx] <= blk[b, qi])
        elif rule == "bd3lm":
            qb, kb, qc, kc = blk[b, qi], blk[b, kv_idx], cl[b, qi], cl[b, kv_idx]
            same = kb == qb
            if copies:
                same = same & (cp[b, kv_idx] == cp[b, qi])
            ok = ok & (((kc == 1) & (kb < qb + qc)) | ((kc + qc == 0) & same))
        result: torch.Tensor = ok
        return result

    return mask_mod


def _tiles(x: torch.Tensor, keep: torch.Tensor, tile: int, op: str) -> torch.Tensor:
    """Reduce [B, L] over tiles of `tile` positions, only where `keep` (neutral fill elsewhere)."""
    b, n = x.shape
    if op == "min":
        x = torch.where(keep, x, torch.full_like(x, _I32_MAX))
        return x.view(b, n // tile, tile).amin(-1)
    x = torch.where(keep, x, torch.full_like(x, -1))
    return x.view(b, n // tile, tile).amax(-1)


def tile_classes(
    mask: AttentionMask, pos: _Positions, q_len: int, k_len: int, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, full): bool [B, Tq, Tk]; `any` over-approximates "some pair may attend", `full`
    under-approximates "every pair may attend" (so partial = any & ~full needs the mask_mod)."""
    offset = k_len - q_len
    nq = math.ceil(q_len / tile) * tile

    def qside(x: torch.Tensor, fill: int | bool) -> torch.Tensor:
        out = x[:, offset:offset + q_len]
        return torch.nn.functional.pad(out, (0, nq - q_len), value=fill)

    # query-side tensors: key positions offset .. offset + Lq, padded to the tile
    qv = qside(torch.ones_like(pos.real), False)
    kv_real = pos.real
    kv_valid = torch.zeros_like(kv_real)
    kv_valid[:, :k_len] = True
    q_seg, q_blk, q_cl = qside(pos.seg, 0), qside(pos.blk, 0), qside(pos.clean, False)
    q_cp = qside(pos.copy, 0)

    def stats(seg: torch.Tensor, blk: torch.Tensor, cl: torch.Tensor, cp: torch.Tensor,
              keep: torch.Tensor) -> dict[str, torch.Tensor]:
        # copy ids are summarised over the noisy positions only (the only ones whose copy is read)
        noisy = keep & ~cl
        return {
            "seg_lo": _tiles(seg, keep, tile, "min"), "seg_hi": _tiles(seg, keep, tile, "max"),
            "blk_lo": _tiles(blk, keep, tile, "min"), "blk_hi": _tiles(blk, keep, tile, "max"),
            "cp_lo": _tiles(cp, noisy, tile, "min"), "cp_hi": _tiles(cp, noisy, tile, "max"),
            "clean": _tiles((cl & keep).int(), keep, tile, "max") > 0,
            "noisy": _tiles((~cl & keep).int(), keep, tile, "max") > 0,
        }

    q = {k: v[:, :, None] for k, v in stats(q_seg, q_blk, q_cl, q_cp, qv).items()}
    k_any = {k: v[:, None, :] for k, v in stats(pos.seg, pos.blk, pos.clean, pos.copy, kv_real).items()}
    k_all = {k: v[:, None, :] for k, v in stats(pos.seg, pos.blk, pos.clean, pos.copy, kv_valid).items()}
    n_tiles = pos.real.shape[1] // tile
    k_has_real = pos.real.view(pos.real.shape[0], n_tiles, tile).any(-1)[:, None, :]
    k_all_real = pos.real.view(pos.real.shape[0], n_tiles, tile).all(-1)[:, None, :]

    any_ = k_has_real & (k_any["seg_lo"] <= q["seg_hi"]) & (q["seg_lo"] <= k_any["seg_hi"])
    full = (
        k_all_real
        & (q["seg_lo"] == q["seg_hi"]) & (k_all["seg_lo"] == k_all["seg_hi"])
        & (q["seg_lo"] == k_all["seg_lo"])
    )
    rule = mask.rule
    if rule == "block_causal":
        any_ = any_ & (k_any["blk_lo"] <= q["blk_hi"])
        full = full & (k_all["blk_hi"] <= q["blk_lo"])
    elif rule == "bd3lm":
        qc, qn = q["clean"], q["noisy"]
        kc, kn = k_any["clean"], k_any["noisy"]
        lo, hi = k_any["blk_lo"], k_any["blk_hi"]
        copy_meet = (k_any["cp_lo"] <= q["cp_hi"]) & (q["cp_lo"] <= k_any["cp_hi"])
        any_ = any_ & (
            (qc & kc & (lo <= q["blk_hi"]))
            | (qn & kc & (lo < q["blk_hi"]))
            | (qn & kn & (lo <= q["blk_hi"]) & (q["blk_lo"] <= hi) & copy_meet)
        )
        kc, kn = k_all["clean"], k_all["noisy"]
        lo, hi = k_all["blk_lo"], k_all["blk_hi"]
        same_block = (q["blk_lo"] == q["blk_hi"]) & (lo == hi) & (lo == q["blk_lo"])
        if mask.copy_ids is not None:
            one_copy = (q["cp_lo"] == q["cp_hi"]) & (k_all["cp_lo"] == k_all["cp_hi"]) & (q["cp_lo"] == k_all["cp_lo"])
            same_block = same_block & one_copy
        full = full & ~(qc & kn)
        full = full & (~(qc & kc) | (hi <= q["blk_lo"])) & (~(qn & kc) | (hi < q["blk_lo"]))
        full = full & (~(qn & kn) | same_block)
    return any_, full & any_


def _ordered(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num [B, 1, Tq], indices [B, 1, Tq, Tk]) int32 with the selected kv tiles first."""
    num = sel.sum(-1, dtype=torch.int32)
    idx = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num[:, None], idx[:, None]


def build_block_mask(
    mask: AttentionMask, batch: int, q_len: int, k_len: int, device: torch.device, *, tile: int = TILE
) -> BlockMask | None:
    """Sparse BlockMask of `mask` for [batch, ., q_len, .] queries over k_len keys (None: no mask)."""
    if mask.key_padding is None and mask.cu_seqlens is None and mask.block_ids is None:
        return None
    pad = math.ceil(k_len / tile) * tile
    pos = _positions(mask, batch, k_len, pad, device)
    any_, full = tile_classes(mask, pos, q_len, k_len, tile)
    num, idx = _ordered(any_ & ~full)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=tile,
        mask_mod=mask_mod_for(mask, pos, k_len - q_len), seq_lengths=(q_len, k_len),
    )


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    return torch.compile(flex_attention, dynamic=None)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *,
                options: dict[str, Any] | None = None) -> torch.Tensor:
    """FlexAttention of q [B, Hq, Lq, D] over k, v [B, Hkv, Lk, D]; the BlockMask is memoised on
    `mask` (built once, reused by every layer and by checkpoint recomputation).

    Args:
        options: Triton tile options of the compiled kernel (`flex_attention(kernel_options=...)`),
            e.g. {"BLOCK_M": 64, "BLOCK_N": 64} (`KernelConfig.flex_kernel_options`); None lets
            Inductor choose.
    """
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    key = ("flex", b, lq, lk, str(q.device))
    if key not in mask.cache:
        mask.cache[key] = build_block_mask(mask, b, lq, lk, q.device)
    block_mask = mask.cache[key]
    gqa = k.shape[1] != hq
    if q.device.type == "cuda":
        out = _cuda_flex(q, k, v, block_mask, gqa, options)
    else:
        out = _eager_flex(q, k, v, block_mask, gqa)
    assert isinstance(out, torch.Tensor)
    return out


# Tiles that compile where Inductor's default choice has none: on torch 2.11 the backward of
# short BD3LM rows (e.g. 78 positions, head dim 64) fails with NoValidChoicesError by default and
# compiles with these (docs/benchmarks.md: no slower than the default at SDAR-8B's shape).
FALLBACK_KERNEL_OPTIONS: dict[str, Any] = {"BLOCK_M": 64, "BLOCK_N": 64}
_needs_fallback: set[tuple[Any, ...]] = set()


def _cuda_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask | None,
               gqa: bool, options: dict[str, Any] | None) -> torch.Tensor:
    """Compiled flex with the caller's tile `options`; with none, a shape whose compilation finds no
    kernel is compiled again with fallback tiles."""
    key = (q.shape[1:], k.shape[1:], q.dtype, torch.is_grad_enabled() and q.requires_grad)
    if options is None and key in _needs_fallback:
        options = FALLBACK_KERNEL_OPTIONS
    try:
        out: torch.Tensor = _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options=options)
    except Exception as err:  # noqa: BLE001 - only compilation failures are retried, see below
        if options is not None or "NoValidChoicesError" not in f"{type(err).__name__}: {err}":
            raise
        _needs_fallback.add(key)
        out = _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=gqa,
                               kernel_options=FALLBACK_KERNEL_OPTIONS)
    return out


def _eager_flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask | None, gqa: bool
) -> torch.Tensor:
    """Unfused flex reference for CPU: forward only (torch has no CPU flex backward), run without
    the per-shape dynamo trace that eager flex otherwise does for every new shape."""
    if q.requires_grad or k.requires_grad or v.requires_grad:
        raise ValueError(
            "attention backend 'flex' has no backward on CPU; train on CPU with backend='sdpa'"
        )
    flex_mod: Any = sys.modules[flex_attention.__module__]
    previous = flex_mod._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    flex_mod._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    finally:
        flex_mod._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = previous
    assert isinstance(out, torch.Tensor)
    return out

"""Attention behind one function, with interchangeable backends.

Backends (every one computes the same function of q, k, v and an `AttentionMask`):

- `sdpa`: torch scaled_dot_product_attention with a dense boolean mask (reference, runs everywhere).
- `eager`: explicit float32 softmax (for tests).
- `flex`: FlexAttention with a sparse `BlockMask` built tile by tile from the mask spec (never a
  dense Lq x Lk mask); compiled on CUDA, eager (slow, small inputs only) on CPU.
- `varlen`: torch's built-in flash varlen kernel on packed rows (`cu_seqlens`); CUDA only.
- `flash_attn`: `flash_attn_varlen_func` on packed rows; registered only when flash-attn imports.
- `bd3lm_kernel`: the Triton kernel of the BD3LM training layout (`dllm_models.kernels.bd3lm_attention`:
  forward and backward visit only the key tiles a query tile sees) on a packed row; flex on CUDA
  and sdpa elsewhere for the inputs it does not serve (`bd3lm_fits`).

Masks are specs, not model forks: key padding, packed segments, block-causal block ids and the
BD3LM [x_t ; x_0] training layout (Arriola et al., "Block Diffusion", arXiv 2503.09573) are all
fields of `AttentionMask`.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from dllm_models.kernels.decode_attention import decode_attention, decode_attention_fits, visible_span

DECODE_KERNEL = os.environ.get("DLLM_MODELS_DECODE_ATTENTION", "1") != "0"
# the decode kernel walks each row's visible columns only (`visible_span`, computed once per
# forward in the mask's memo): SDAR-8B, 128 rows x 1024 new, 5,978 -> 6,277 tok/s on the H200
# (docs/benchmarks.md, session 12), the same tokens; DLLM_MODELS_DECODE_SPAN=0 walks every tile
DECODE_SPAN = os.environ.get("DLLM_MODELS_DECODE_SPAN", "1") != "0"


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see.

    Queries are the last Lq of the Lk key positions (a KV cache precedes them); per-position
    fields below are indexed by key position. A call writing into a canvas-wide cache
    (`KVCache.write_columns`) has its queries elsewhere: `key_limit` then says what each sees.

    Attributes:
        key_padding: bool [B, Lk], True for real keys; None means all keys are real.
        block_ids: long [B, Lk] block index per key position for block-causal attention (a
            query sees keys whose block id is <= its own); None means bidirectional.
        cu_seqlens: int32 [n + 1] cumulative lengths of n sequences packed along one row
            (B = 1); attention never crosses sequences. None for padded batches.
        max_seqlen: longest packed sequence (with cu_seqlens).
        is_clean: bool [B, Lk], True on the clean x_0 copy of the BD3LM [x_t ; x_0] layout (needs
            block_ids). Then a noisy query of block b sees noisy keys of block b and clean keys of
            blocks < b; a clean query of block b sees clean keys of blocks <= b. Build it with
            `bd3lm_mask`.
        copy_ids: long [B, Lk] index of the noisy copy each position belongs to, where several
            noisy copies share one clean copy in a segment (`bd3lm_mask(copies=...)`; needs
            is_clean; its value on clean positions is never read). A noisy query then sees, among
            the noisy keys, only those of its own copy and block. None: one noisy copy per segment.
        key_limit: long [Lq]: query i sees only key positions < key_limit[i] (the same for every
            row; with an in-place cache, block-causal visibility over canvas columns for a call
            that covers several blocks). None: no limit.
    """

    key_padding: torch.Tensor | None = None
    block_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    is_clean: torch.Tensor | None = None
    copy_ids: torch.Tensor | None = None
    key_limit: torch.Tensor | None = None
    # per-mask memo of derived structures (flex BlockMask, segment ids); shared by all layers.
    # An init field, so FSDP2's input casting (dataclasses.replace over forward args) can copy it.
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.is_clean is not None and self.block_ids is None:
            raise ValueError("AttentionMask.is_clean (BD3LM layout) needs block_ids; use bd3lm_mask")
        if self.copy_ids is not None and self.is_clean is None:
            raise ValueError("AttentionMask.copy_ids (shared-clean BD3LM layout) needs is_clean; use bd3lm_mask")

    @property
    def rule(self) -> str:
        """'bidirectional', 'block_causal' or 'bd3lm'."""
        if self.block_ids is None:
            return "bidirectional"
        return "block_causal" if self.is_clean is None else "bd3lm"

    def segment_ids(self, device: torch.device) -> torch.Tensor | None:
        """long [Lk_total] index of the packed sequence of each position (None if not packed)."""
        if self.cu_seqlens is None:
            return None
        key = ("segment_ids", str(device))
        if key not in self.cache:
            lengths = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).to(device)
            n = torch.arange(len(lengths), device=device)
            self.cache[key] = torch.repeat_interleave(n, lengths)
        out: torch.Tensor = self.cache[key]
        return out

    def dense(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor | None:
        """Boolean mask [B or 1, 1, Lq, Lk] (True = may attend), or None when unrestricted."""
        mask: torch.Tensor | None = None
        if self.key_padding is not None:
            mask = self.key_padding[:, None, None, -k_len:].to(device=device, dtype=torch.bool)
        seg = self.segment_ids(device)
        if seg is not None:
            same = (seg[-k_len:][None, :] == seg[-q_len:][:, None])[None, None]
            mask = same if mask is None else (mask & same)
        if self.block_ids is not None:
            kb = self.block_ids[:, -k_len:].to(device)[:, None, :]
            qb = self.block_ids[:, -q_len:].to(device)[:, :, None]
            if self.is_clean is None:
                rule = kb <= qb
            else:
                kc = self.is_clean[:, -k_len:].to(device)[:, None, :]
                qc = self.is_clean[:, -q_len:].to(device)[:, :, None]
                same = kb == qb
                if self.copy_ids is not None:
                    same = same & (self.copy_ids[:, -k_len:].to(device)[:, None, :]
                                   == self.copy_ids[:, -q_len:].to(device)[:, :, None])
                rule = (kc & ((qc & (kb <= qb)) | (~qc & (kb < qb)))) | (~kc & ~qc & same)
            mask = rule[:, None] if mask is None else (mask & rule[:, None])
        if self.key_limit is not None:
            limit = _limit_mask(self.key_limit[-q_len:], k_len, device)[None, None]
            mask = limit if mask is None else (mask & limit)
        return mask


def _limit_mask(key_limit: torch.Tensor, k_len: int, device: torch.device) -> torch.Tensor:
    """bool [Lq, Lk]: key position j < key_limit[i]."""
    return torch.arange(k_len, device=device)[None, :] < key_limit.to(device)[:, None]


def bd3lm_mask(
    lengths: Sequence[int],
    block_size: int,
    *,
    copies: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> AttentionMask:
    """Mask of the BD3LM training layout (Arriola et al., arXiv 2503.09573), samples packed along one row.

    Doubled layout (`copies` None): per sample its noisy copy, then its clean copy,
    [x_t^1 ; x_0^1 ; x_t^2 ; x_0^2 ; ...]. Shared-clean layout (`copies` given): sample i's segment
    is its clean copy followed by its k_i noisy copies, [x_0 ; x_t^(1) ; ... ; x_t^(k_i)], and
    every noisy copy sees exactly what it sees in its own doubled segment (its own block, the
    clean earlier blocks), never another copy: the same function for (k_i + 1) L_i positions
    instead of 2 k_i L_i. Blocks are numbered from each sample's absolute position 0 ("global"
    block origin, docs/models.md#forward-contracts), the same in every copy.

    Args:
        lengths: length L_i of each sample.
        block_size: diffusion block size.
        copies: number k_i >= 1 of noisy copies of each sample (shared-clean layout), or None.
        device: where the mask tensors live.

    Returns:
        AttentionMask with cu_seqlens over the samples' segments (2 L_i or (k_i + 1) L_i
        positions), block_ids, is_clean and (shared-clean layout) copy_ids [1, total].
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {list(lengths)}")
    if copies is not None and (len(copies) != len(lengths) or min(copies) < 1):
        raise ValueError(f"copies must give one positive count per sample ({len(lengths)}), got {list(copies)}")
    blocks, clean, copy = [], [], []
    sizes = []
    for i, n in enumerate(lengths):
        b = torch.arange(n, device=device) // block_size
        yes = torch.ones(n, dtype=torch.bool, device=device)
        if copies is None:
            blocks += [b, b]
            clean += [~yes, yes]
            sizes.append(2 * n)
            continue
        k = int(copies[i])
        blocks += [b] * (k + 1)
        clean += [yes] + [~yes] * k
        copy.append(torch.arange(k + 1, device=device).repeat_interleave(n))
        sizes.append((k + 1) * n)
    seg = torch.tensor([0] + sizes, device=device).cumsum(0).to(torch.int32)
    return AttentionMask(
        block_ids=torch.cat(blocks)[None],
        cu_seqlens=seg,
        max_seqlen=max(sizes),
        is_clean=torch.cat(clean)[None],
        copy_ids=torch.cat(copy)[None] if copies is not None else None,
    )


AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMask], torch.Tensor]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    if q.shape[1] != k.shape[1] and mask.block_ids is None and mask.cu_seqlens is None:
        return _sdpa_grouped(q, k, v, mask)
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    if q.is_cuda and q.shape[1] != k.shape[1]:
        # grouped heads natively: no [B, Hq, Lk, D] copies of the keys and values per call
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=False, enable_gqa=True)
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=False)


def _sdpa_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """Grouped-query attention when the keys a query sees depend on its row and `key_limit` only.

    The n_rep query heads of each KV head are folded into the query axis ([B, Hkv, n_rep * Lq, D];
    folded query r * Lq + i is query i of head r), so one plain attention call serves the group:
    no K/V copies and no GQA-specific kernel. At a few queries per row (a cached decoding step)
    the Triton kernel `decode_attention` serves it where it runs: it reads only the visible keys
    (`DLLM_MODELS_DECODE_ATTENTION=0` switches it off).
    """
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    if DECODE_KERNEL and decode_attention_fits(q, k):
        span = None
        if DECODE_SPAN and mask.key_padding is not None:
            key = ("visible_span", k.shape[2])
            span = mask.cache.get(key)
            if span is None:  # once per forward: every layer sees the same padding
                span = mask.cache[key] = visible_span(mask.key_padding[:, -k.shape[2]:].to(q.device))
        return decode_attention(q, k, v, mask.key_padding, mask.key_limit, span=span)
    folded = q.reshape(b, hkv, (hq // hkv) * lq, d)
    # [B, 1, 1, Lk] or None: the key padding, the same for every query of a row
    dense = None if mask.key_padding is None else mask.key_padding[:, None, None, -k.shape[2]:].to(q.device, torch.bool)
    if mask.key_limit is not None:  # [1, 1, n_rep * Lq, Lk]
        limit = _limit_mask(mask.key_limit[-lq:].repeat(hq // hkv), k.shape[2], q.device)[None, None]
        dense = limit if dense is None else (dense & limit)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=dense, is_causal=False)
    return out.reshape(b, hq, lq, d)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    if dense is not None:
        scores = scores.masked_fill(~dense, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v.float()).to(q.dtype)


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    if mask.key_limit is not None:
        # a decoding call over several blocks of an in-place cache: a few queries, no backward;
        # sdpa computes the same function without a BlockMask per call
        return _sdpa(q, k, v, mask)
    from dllm_models.flex import flex_attend

    return flex_attend(q, k, v, mask)


def _bd3lm_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    from dllm_models.kernels.bd3lm_attention import bd3lm_attend, bd3lm_fits

    if bd3lm_fits(q, k, mask):
        return bd3lm_attend(q, k, v, mask)
    return _flex(q, k, v, mask) if q.is_cuda else _sdpa(q, k, v, mask)


def _packed_rows(
    q: torch.Tensor, k: torch.Tensor, mask: AttentionMask, backend: str
) -> tuple[torch.Tensor, int]:
    """cu_seqlens (int32) and max_seqlen for a varlen kernel, validating the mask."""
    if mask.block_ids is not None or mask.key_padding is not None:
        raise ValueError(
            f"attention backend {backend!r} supports only packed (cu_seqlens) or unmasked input, "
            "not key_padding/block_ids: pack the batch with dllm_models.packing.pack, or use "
            "backend='flex' (block masks) or 'sdpa'"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"attention backend {backend!r} needs Lq == Lk (no KV cache); use 'sdpa'")
    b, _, n, _ = q.shape
    if mask.cu_seqlens is None:  # every row is one full sequence
        cu = torch.arange(0, (b + 1) * n, n, device=q.device, dtype=torch.int32)
        return cu, n
    if b != 1:
        raise ValueError(f"packed input (cu_seqlens) must have batch size 1, got {b}")
    cu = mask.cu_seqlens.to(device=q.device, dtype=torch.int32)
    max_len = mask.max_seqlen if mask.max_seqlen is not None else int((cu[1:] - cu[:-1]).max())
    return cu, max_len


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    if q.device.type != "cuda":
        raise RuntimeError(
            f"attention backend 'varlen' needs a CUDA device (torch's varlen_attn has no "
            f"{q.device.type} kernel); use backend='sdpa' or 'flex' there, see available_backends()"
        )
    from torch.nn.attention.varlen import varlen_attn

    cu, max_len = _packed_rows(q, k, mask, "varlen")
    b, hq, n, d = q.shape
    params = inspect.signature(varlen_attn).parameters
    if "enable_gqa" not in params:
        k, v = _repeat_kv(k, hq // k.shape[1]), _repeat_kv(v, hq // k.shape[1])
    kwargs: dict[str, Any] = {}
    if "enable_gqa" in params and k.shape[1] != hq:
        kwargs["enable_gqa"] = True
    # [B, H, L, D] -> [B * L, H, D]
    qf, kf, vf = (x.transpose(1, 2).reshape(b * n, x.shape[1], d) for x in (q, k, v))
    out = varlen_attn(qf, kf, vf, cu, cu, max_len, max_len, **kwargs)
    assert isinstance(out, torch.Tensor)
    return out.view(b, n, hq, d).transpose(1, 2)


BACKENDS: dict[str, AttentionFn] = {
    "sdpa": _sdpa,
    "eager": _eager,
    "flex": _flex,
    "varlen": _varlen,
    "bd3lm_kernel": _bd3lm_kernel,
}

try:  # optional extra `flash-attn`
    from flash_attn import flash_attn_varlen_func as _flash_varlen  # type: ignore[import-not-found,unused-ignore]
except Exception:  # noqa: BLE001 - any import failure (missing, ABI mismatch) means "not available"
    _flash_varlen = None

if _flash_varlen is not None:

    def _flash_attn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask
    ) -> torch.Tensor:
        cu, max_len = _packed_rows(q, k, mask, "flash_attn")
        b, hq, n, d = q.shape
        qf, kf, vf = (x.transpose(1, 2).reshape(b * n, x.shape[1], d) for x in (q, k, v))
        out = _flash_varlen(qf, kf, vf, cu, cu, max_len, max_len, causal=False)
        return torch.as_tensor(out).view(b, n, hq, d).transpose(1, 2)

    BACKENDS["flash_attn"] = _flash_attn


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Backends of `BACKENDS` that run on `device` ('flex' on CPU is eager: small inputs only)."""
    kind = torch.device(device).type
    names = ["sdpa", "eager", "flex", "bd3lm_kernel"]
    if kind == "cuda":
        names += [n for n in ("varlen", "flash_attn") if n in BACKENDS]
    return names


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, backend: str = "sdpa"
) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads (Vaswani et al., arXiv 1706.03762).

    Args:
        q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D] with Hq a multiple of Hkv.
        mask: which keys each query may see.
        backend: a key of `BACKENDS` (see `available_backends(device)`).

    Returns:
        [B, Hq, Lq, D] in q's dtype.
    """
    fn = BACKENDS.get(backend)
    if fn is None:
        raise ValueError(
            f"attention backend {backend!r} is not available; choose one of {sorted(BACKENDS)}"
        )
    return fn(q, k, v, mask)

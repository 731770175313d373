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

Masks are specs, not model forks (`dllm_models.mask`: key padding, packed segments, block-causal
block ids and the BD3LM [x_t ; x_0] training layout of Arriola et al., arXiv 2503.09573). How a
backend runs (the decode kernel and its tuning, flex tiles) is the caller's `KernelConfig`, passed
with every call; it never changes the function computed.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from dllm_models.kernels.decode_attention import decode_attention, decode_attention_fits, visible_span
from dllm_models.layers import KernelConfig
from dllm_models.mask import AttentionMask, bd3lm_mask, key_limit_mask

__all__ = ["BACKENDS", "AttentionFn", "AttentionMask", "attend", "available_backends", "bd3lm_mask"]

DEFAULT = KernelConfig()
"""The kernels of a call that names none: every switch at its default (the decode kernel on, with its span walk)."""


class AttentionFn(Protocol):
    """A backend: attention of q [B, Hq, Lq, D] over k, v [B, Hkv, Lk, D] under `mask`, run as `kernels` says."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                 kernels: KernelConfig = DEFAULT) -> torch.Tensor: ...


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
          kernels: KernelConfig = DEFAULT) -> torch.Tensor:
    if q.shape[1] != k.shape[1] and mask.block_ids is None and mask.cu_seqlens is None:
        return _sdpa_grouped(q, k, v, mask, kernels)
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    if q.is_cuda and q.shape[1] != k.shape[1]:
        # grouped heads natively: no [B, Hq, Lk, D] copies of the keys and values per call
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=False, enable_gqa=True)
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=False)


def _sdpa_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                  kernels: KernelConfig = DEFAULT) -> torch.Tensor:
    """Grouped-query attention when the keys a query sees depend on its row and `key_limit` only.

    The n_rep query heads of each KV head are folded into the query axis ([B, Hkv, n_rep * Lq, D];
    folded query r * Lq + i is query i of head r), so one plain attention call serves the group:
    no K/V copies and no GQA-specific kernel. At a few queries per row (a cached decoding step)
    the Triton kernel `decode_attention` serves it where it runs: it reads only the visible keys
    (`kernels.decode_attention=False` switches it off). With `kernels.decode_span` it walks each row's
    visible columns only (`visible_span`, computed once per forward in the mask's memo): SDAR-8B,
    128 rows x 1024 new, 5,978 -> 6,277 tok/s on the H200 (docs/benchmarks.md, session 12), the same tokens.
    """
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    if kernels.decode_attention and decode_attention_fits(q, k, max_rows=kernels.decode_max_rows):
        span = None
        if kernels.decode_span and mask.key_padding is not None:
            key = ("visible_span", k.shape[2])
            span = mask.cache.get(key)
            if span is None:  # once per forward: every layer sees the same padding
                span = mask.cache[key] = visible_span(mask.key_padding[:, -k.shape[2]:].to(q.device))
        return decode_attention(q, k, v, mask.key_padding, mask.key_limit, span=span, splits=kernels.decode_splits,
                                block_n=kernels.decode_block_n, stages=kernels.decode_stages)
    folded = q.reshape(b, hkv, (hq // hkv) * lq, d)
    # [B, 1, 1, Lk] or None: the key padding, the same for every query of a row
    dense = None if mask.key_padding is None else mask.key_padding[:, None, None, -k.shape[2]:].to(q.device, torch.bool)
    if mask.key_limit is not None:  # [1, 1, n_rep * Lq, Lk]
        limit = key_limit_mask(mask.key_limit[-lq:].repeat(hq // hkv), k.shape[2], q.device)[None, None]
        dense = limit if dense is None else (dense & limit)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=dense, is_causal=False)
    return out.reshape(b, hq, lq, d)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
           kernels: KernelConfig = DEFAULT) -> torch.Tensor:
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    if dense is not None:
        scores = scores.masked_fill(~dense, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v.float()).to(q.dtype)


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
          kernels: KernelConfig = DEFAULT) -> torch.Tensor:
    if mask.key_limit is not None:
        # a decoding call over several blocks of an in-place cache: a few queries, no backward;
        # sdpa computes the same function without a BlockMask per call
        return _sdpa(q, k, v, mask, kernels)
    from dllm_models.flex import flex_attend  # imports FlexAttention only when the backend is chosen

    return flex_attend(q, k, v, mask, options=kernels.flex_options)


def _bd3lm_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
                  kernels: KernelConfig = DEFAULT) -> torch.Tensor:
    from dllm_models.kernels.bd3lm_attention import bd3lm_attend, bd3lm_fits

    if bd3lm_fits(q, k, mask):
        return bd3lm_attend(q, k, v, mask, options=kernels.bd3lm_options)
    return _flex(q, k, v, mask, kernels) if q.is_cuda else _sdpa(q, k, v, mask, kernels)


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


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
            kernels: KernelConfig = DEFAULT) -> torch.Tensor:
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
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, kernels: KernelConfig = DEFAULT
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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, backend: str = "sdpa",
    kernels: KernelConfig = DEFAULT,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads (Vaswani et al., arXiv 1706.03762).

    Args:
        q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D] with Hq a multiple of Hkv.
        mask: which keys each query may see.
        backend: a key of `BACKENDS` (see `available_backends(device)`).
        kernels: how the backend runs (the model's `KernelConfig`: decode kernel, its tuning, flex
            tiles); the function computed is the same.

    Returns:
        [B, Hq, Lq, D] in q's dtype.
    """
    fn = BACKENDS.get(backend)
    if fn is None:
        raise ValueError(
            f"attention backend {backend!r} is not available; choose one of {sorted(BACKENDS)}"
        )
    return fn(q, k, v, mask, kernels)

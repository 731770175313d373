"""Attention behind one function, with interchangeable backends.

Backends: `sdpa` (reference, runs everywhere) and `eager` (explicit softmax, for tests). More
backends register themselves in `BACKENDS`; every backend computes the same function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see.

    Attributes:
        key_padding: bool [B, Lk], True for real keys; None means all keys are real.
        block_ids: long [B, Lk] block index per key position for block-causal attention (a
            query sees keys whose block id is <= its own; queries are the last Lq positions);
            None means bidirectional.
        cu_seqlens: int32 [n + 1] cumulative lengths of n sequences packed along one row
            (B = 1); attention never crosses sequences. None for padded batches.
        max_seqlen: longest packed sequence (with cu_seqlens).
    """

    key_padding: torch.Tensor | None = None
    block_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None

    def dense(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor | None:
        """Boolean mask [B or 1, 1, Lq, Lk] (True = may attend), or None when unrestricted."""
        mask: torch.Tensor | None = None
        if self.key_padding is not None:
            mask = self.key_padding[:, None, None, :].to(device=device, dtype=torch.bool)
        if self.cu_seqlens is not None:
            lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
            seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths.to(device))
            same = (seg[-k_len:][None, :] == seg[-q_len:][:, None])[None, None]
            mask = same if mask is None else (mask & same)
        if self.block_ids is not None:
            k_blocks = self.block_ids[:, -k_len:]
            q_blocks = self.block_ids[:, -q_len:]
            causal = (k_blocks[:, None, :] <= q_blocks[:, :, None])[:, None]
            mask = causal if mask is None else (mask & causal)
        return mask


AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMask], torch.Tensor]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, is_causal=False)


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    dense = mask.dense(q.shape[2], k.shape[2], q.device)
    if dense is not None:
        scores = scores.masked_fill(~dense, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v.float()).to(q.dtype)


BACKENDS: dict[str, AttentionFn] = {"sdpa": _sdpa, "eager": _eager}


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, backend: str = "sdpa"
) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads.

    Args:
        q: [B, Hq, Lq, D]; k, v: [B, Hkv, Lk, D] with Hq a multiple of Hkv.
        mask: which keys each query may see.
        backend: a key of `BACKENDS`.

    Returns:
        [B, Hq, Lq, D] in q's dtype.
    """
    fn = BACKENDS.get(backend)
    if fn is None:
        raise ValueError(
            f"attention backend {backend!r} is not available; choose one of {sorted(BACKENDS)}"
        )
    return fn(q, k, v, mask)

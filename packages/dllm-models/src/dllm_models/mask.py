"""Attention mask specs: which keys each query may see (`AttentionMask`, `bd3lm_mask`).

Masks are specs, not model forks: key padding, packed segments, block-causal block ids and the
BD3LM [x_t ; x_0] training layout (Arriola et al., "Block Diffusion", arXiv 2503.09573) are all
fields of `AttentionMask`. Every attention backend (`dllm_models.attention`, `dllm_models.flex`)
reads this one spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


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
            limit = key_limit_mask(self.key_limit[-q_len:], k_len, device)[None, None]
            mask = limit if mask is None else (mask & limit)
        return mask


def key_limit_mask(key_limit: torch.Tensor, k_len: int, device: torch.device) -> torch.Tensor:
    """bool [Lq, Lk]: key position j < key_limit[i]."""
    return torch.arange(k_len, device=device)[None, :] < key_limit.to(device)[:, None]


def bd3lm_mask(
    lengths: Sequence[int],
    block_size: int,
    *,
    copies: Sequence[int] | None = None,
    keep: torch.Tensor | None = None,
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

    `keep` drops positions from that layout: a dropped position is neither a query nor a key,
    and every kept position keeps its block, copy and clean flag. Dropping whole (copy, block)
    runs of noisy positions that no scored query reads (a noisy block is seen by its own queries
    only) leaves every other position's attention unchanged: the sparse layout of
    `dllm_train.packed_scoring`. The block ids then no longer follow from the run lengths:
    pass each kept position's position id to the forward (`position_ids`).

    Args:
        lengths: length L_i of each sample.
        block_size: diffusion block size.
        copies: number k_i >= 1 of noisy copies of each sample (shared-clean layout), or None.
        keep: bool [total] over the positions of the whole layout (2 L_i or (k_i + 1) L_i per
            sample, in order): the positions to keep; None keeps all. Segments left empty are
            dropped from cu_seqlens.
        device: where the mask tensors live.

    Returns:
        AttentionMask with cu_seqlens over the samples' segments (2 L_i or (k_i + 1) L_i
        positions, fewer with `keep`), block_ids, is_clean and (shared-clean layout) copy_ids
        [1, total].
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
    block_ids, is_clean = torch.cat(blocks), torch.cat(clean)
    copy_ids = torch.cat(copy) if copies is not None else None
    if keep is not None:
        sizes, keep = _kept_sizes(keep, sizes, block_ids.device)
        block_ids, is_clean = block_ids[keep], is_clean[keep]
        copy_ids = None if copy_ids is None else copy_ids[keep]
    seg = torch.tensor([0] + sizes, device=device).cumsum(0).to(torch.int32)
    return AttentionMask(
        block_ids=block_ids[None],
        cu_seqlens=seg,
        max_seqlen=max(sizes),
        is_clean=is_clean[None],
        copy_ids=copy_ids[None] if copy_ids is not None else None,
    )


def _kept_sizes(keep: torch.Tensor, sizes: list[int], device: torch.device) -> tuple[list[int], torch.Tensor]:
    """(sizes of the non-empty segments after `keep`, `keep` as a bool tensor on `device`)."""
    total = sum(sizes)
    if keep.dtype != torch.bool or keep.dim() != 1 or keep.numel() != total:
        raise ValueError(f"keep must be a bool [total] tensor over the layout's {total} positions, got "
                         f"{keep.dtype} of shape {tuple(keep.shape)}")
    keep = keep.to(device)
    seg = torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device))
    kept = torch.zeros(len(sizes), dtype=torch.long, device=device).index_add_(0, seg, keep.long()).tolist()
    out = [int(n) for n in kept if n > 0]
    if not out:
        raise ValueError("keep drops every position of the layout; keep at least one")
    return out, keep


__all__ = ["AttentionMask", "bd3lm_mask", "key_limit_mask"]

"""Pack a padded batch into one row (no padding) and unpack per-token outputs back.

Packed rows feed the `varlen`, `flash_attn` and `flex` backends: attention never crosses
sequences (`cu_seqlens`) and position ids restart at 0 for every sequence, so RoPE sees the same
positions as in the padded batch (`positions_from_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_models.attention import AttentionMask


@dataclass(frozen=True)
class Packed:
    """A padded [B, L] batch packed into one row of T real tokens.

    Attributes:
        input_ids: [1, T] the real tokens, row after row.
        position_ids: [1, T] position of each token inside its own sequence.
        cu_seqlens: int32 [B + 1] cumulative sequence lengths (rows with no real token give
            empty segments).
        max_seqlen: longest sequence.
        indices: long [T] flat index (row * L + column) of each packed token in the padded batch.
        batch_size, seq_len: the padded shape [B, L].
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    indices: torch.Tensor
    batch_size: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.indices.numel())

    def attention_mask(self) -> AttentionMask:
        """The attention mask of the packed row (block-diagonal over sequences)."""
        return AttentionMask(cu_seqlens=self.cu_seqlens, max_seqlen=self.max_seqlen)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Packed:
    """Pack the real tokens of a padded batch into one row.

    Args:
        input_ids: [B, L] token ids.
        attention_mask: [B, L], 1/True on real tokens (left, right or no padding); None: all real.

    Returns:
        Packed with [1, T] ids and per-sequence positions, T = number of real tokens.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    b, n = input_ids.shape
    real = (
        torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    )
    if real.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(real.shape)} must equal input_ids shape {(b, n)}"
        )
    flat = real.reshape(-1)
    indices = flat.nonzero().squeeze(-1)
    positions = (real.long().cumsum(-1) - 1).reshape(-1)[indices]
    lengths = real.sum(-1)
    cu = torch.zeros(b + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = lengths.cumsum(0)
    return Packed(
        input_ids=input_ids.reshape(-1)[indices][None],
        position_ids=positions[None],
        cu_seqlens=cu,
        max_seqlen=int(lengths.max()) if b else 0,
        indices=indices,
        batch_size=b,
        seq_len=n,
    )


def pack_like(x: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Pack another per-token tensor x [B, L, ...] (labels, loss masks) as `packed` -> [1, T, ...]."""
    if tuple(x.shape[:2]) != (packed.batch_size, packed.seq_len):
        raise ValueError(
            f"x must start with the padded shape {(packed.batch_size, packed.seq_len)}, "
            f"got {tuple(x.shape)}"
        )
    return x.reshape(-1, *x.shape[2:])[packed.indices][None]


def unpack(x: torch.Tensor, packed: Packed, *, fill: float = 0.0) -> torch.Tensor:
    """Scatter packed per-token values back to the padded layout.

    Args:
        x: [1, T, ...] or [T, ...] values of the packed tokens (logits, log-probs, values).
        packed: the packing that produced the row.
        fill: value written at padded positions.

    Returns:
        [B, L, ...] with `fill` on padding (differentiable w.r.t. x).
    """
    flat = x[0] if x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] == packed.num_tokens else x
    if flat.shape[0] != packed.num_tokens:
        raise ValueError(
            f"x has {flat.shape[0]} tokens along its token axis, the packing has {packed.num_tokens}"
        )
    rest = tuple(flat.shape[1:])
    out = flat.new_full((packed.batch_size * packed.seq_len, *rest), fill)
    out = out.index_copy(0, packed.indices, flat)
    return out.view(packed.batch_size, packed.seq_len, *rest)

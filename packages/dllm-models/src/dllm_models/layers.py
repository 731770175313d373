"""Building blocks shared by the families: RMSNorm, rotary embeddings, SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm that normalises in float32, rounds to the input dtype, then scales.

    This is the LLaDA/Dream/LLaDA2 numerics (spec §1.1); `scale_in_fp32=True` multiplies by the
    weight before rounding (SDAR's fused-kernel numerics).
    """

    def __init__(self, dim: int, eps: float, *, scale_in_fp32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (normed * self.weight.float()).to(x.dtype)
        return normed.to(x.dtype) * self.weight


def rope_cos_sin(
    position_ids: torch.Tensor, rotary_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables in float32 for rotate-half RoPE.

    Args:
        position_ids: [B, L] integer positions.
        rotary_dim: number of rotated dimensions (even).
        theta: RoPE base.

    Returns:
        cos, sin: [B, 1, L, rotary_dim] float32.
    """
    inv_freq = 1.0 / (
        theta
        ** (torch.arange(0, rotary_dim, 2, device=position_ids.device, dtype=torch.float32) / rotary_dim)
    )
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, full_precision: bool
) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` dims of `x` [B, H, L, D] (partial rotary leaves the rest).

    With `full_precision` the rotation runs in float32 and is cast back (LLaDA); otherwise cos/sin
    are cast to x's dtype first (Dream, SDAR, LLaDA2).
    """
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if full_precision:
        out = (x_rot.float() * cos + _rotate_half(x_rot.float()) * sin).to(x.dtype)
    else:
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        out = x_rot * c + _rotate_half(x_rot) * s
    return torch.cat([out, x_pass], dim=-1) if x_pass.shape[-1] else out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: silu(gate) * up."""
    return F.silu(gate) * up


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, L] that start at 0 on each row's first real token (left padding safe)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


class FastLinear(nn.Linear):
    """`nn.Linear` that skips its own random init: weights stay uninitialised until the family's
    `reset_parameters` or a checkpoint fills them (building 10k+ experts fast, also on meta)."""

    def reset_parameters(self) -> None:
        return None


class FastEmbedding(nn.Embedding):
    """`nn.Embedding` that skips its own random init (on the meta device `normal_` would import
    torch._dynamo, seconds of start-up); the family's `reset_parameters` or a checkpoint fills it."""

    def reset_parameters(self) -> None:
        return None

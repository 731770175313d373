"""Building blocks shared by the families: RMSNorm, rotary embeddings, SwiGLU.

Each elementwise op has a plain PyTorch path and a fused Triton path (`dllm_models.kernels`)
with the same numerics; `KernelConfig` picks between them per call (fused on CUDA by default).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dllm_models import kernels as _kernels
from dllm_models.kernels import runs_on


@dataclass(frozen=True)
class KernelConfig:
    """Which implementation the decoder layers' elementwise ops use (RMSNorm with the residual
    add, per-head q/k norm + RoPE, SwiGLU).

    Attributes:
        fused: run the fused Triton kernels of `dllm_models.kernels` on CUDA tensors (and on CPU
            under TRITON_INTERPRET=1, for tests); the plain PyTorch path otherwise. Both give the
            same float32-accumulated numerics and output dtypes.
    """

    fused: bool = True

    def use_fused(self, x: torch.Tensor) -> bool:
        """Whether an op on `x` takes the fused path."""
        return self.fused and runs_on(x)


PLAIN = KernelConfig(fused=False)
"""The plain PyTorch path (the default of every layer called on its own)."""

DEFAULT_KERNELS = KernelConfig(fused=os.environ.get("DLLM_FUSED_KERNELS", "1") != "0")
"""A model's default: fused on CUDA unless the environment sets DLLM_FUSED_KERNELS=0."""


class RMSNorm(nn.Module):
    """RMSNorm that normalises in float32, rounds to the input dtype, then scales.

    This is the LLaDA/Dream/LLaDA2 numerics (docs/models.md#architectures); `scale_in_fp32=True`
    multiplies by the weight before rounding (SDAR's fused-kernel numerics).
    """

    def __init__(self, dim: int, eps: float, *, scale_in_fp32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor, kernels: KernelConfig = PLAIN) -> torch.Tensor:
        """Normalise x [..., D] over its last dim; same shape, x's dtype (see the class)."""
        if kernels.use_fused(x) and self._fusable(x):
            return _kernels.rms_norm(x, self.weight, self.eps, scale_in_fp32=self.scale_in_fp32)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (normed * self.weight.float()).to(x.dtype)
        return normed.to(x.dtype) * self.weight

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor, kernels: KernelConfig = PLAIN
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm block's residual add, fused with the norm.

        Args:
            x, residual: [..., D] of one shape and dtype (the residual stream and a branch output).
        """
        if kernels.use_fused(x) and self._fusable(x) and residual.shape == x.shape and residual.dtype == x.dtype:
            return _kernels.add_rms_norm(x, residual, self.weight, self.eps, scale_in_fp32=self.scale_in_fp32)
        total = x + residual
        return self(total), total

    def _fusable(self, x: torch.Tensor) -> bool:
        # round-then-scale promotes to the weight's dtype when it differs: keep the plain path there
        return self.scale_in_fp32 or self.weight.dtype == x.dtype


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


def rotate_heads(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    norm: RMSNorm | None,
    full_precision: bool,
    kernels: KernelConfig = PLAIN,
) -> torch.Tensor:
    """Per-head RMSNorm (Qwen3/SDAR, LLaDA2 q/k norm; none when `norm` is None), then RoPE.

    Args:
        x: [B, L, H, D] projected queries or keys (the last dim contiguous).
        cos, sin: [B or 1, 1, L, R] from `rope_cos_sin`.
        norm: the head norm over D, or None.
        full_precision: see `apply_rope`.

    Returns:
        [B, H, L, D] (the attention layout), x's dtype.
    """
    if kernels.use_fused(x) and x.stride(-1) == 1 and (norm is None or norm._fusable(x)):
        weight = norm.weight if norm is not None else None
        eps = norm.eps if norm is not None else 0.0
        scale = norm.scale_in_fp32 if norm is not None else False
        out = _kernels.norm_rope(
            x, cos, sin, weight=weight, eps=eps, scale_in_fp32=scale, full_precision=full_precision
        )
        return out.transpose(1, 2)
    if norm is not None:
        x = norm(x)
    return apply_rope(x.transpose(1, 2), cos, sin, full_precision=full_precision)


def swiglu(gate: torch.Tensor, up: torch.Tensor, kernels: KernelConfig = PLAIN) -> torch.Tensor:
    """SwiGLU activation: silu(gate) * up (Shazeer, "GLU Variants Improve Transformer", 2002.05202)."""
    if kernels.use_fused(gate) and gate.shape == up.shape and gate.dtype == up.dtype:
        return _kernels.swiglu(gate, up)
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

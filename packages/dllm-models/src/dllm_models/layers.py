"""Building blocks shared by the families: RMSNorm, rotary embeddings, SwiGLU.

Each elementwise op has a plain PyTorch path and a fused Triton path (`dllm_models.kernels`)
with the same numerics; `KernelConfig` picks between them per call (fused on CUDA by default) and
holds the attention kernels' switches too (`dllm_models.attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dllm_models import kernels as _kernels
from dllm_models.kernels import runs_on
from dllm_models.kernels.bd3lm_options import BACKWARD_VARIANTS, BD3LMKernelOptions


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """How a model's forward runs on the GPU: which kernels, tuned how (never what it computes).

    Every switch gives the same function (tests compare both settings), up to floating-point rounding.

    A model holds one (`model.kernels`, set from the run config) and passes it down its forward to
    every layer and attention call; nothing is read from the environment.

    Attributes:
        fused: the decoder layers' elementwise ops (RMSNorm with the residual add, per-head q/k
            norm + RoPE, SwiGLU) run the fused Triton kernels of `dllm_models.kernels` on CUDA
            tensors (and on CPU under TRITON_INTERPRET=1, for tests); the plain PyTorch path
            otherwise. Both give the same float32-accumulated numerics and output dtypes.
        decode_attention: a cached decoding step (a few queries per row over a wide, partly
            visible KV cache) runs the Triton kernel `kernels.decode_attention`, which reads only
            the visible keys, where it fits; False: dense-mask sdpa.
        decode_span: the decode kernel walks each row's visible column range only (5 % faster
            decoding of SDAR-8B on the H200); False: every tile, skipping those with no visible column.
        decode_splits: programs per (row, KV head) of the decode kernel, over contiguous column
            ranges merged by a second kernel (flash-decoding); 1: one program.
        decode_max_rows: the most query rows per decode-kernel program (n_rep x block length;
            at most 128); larger steps take sdpa. 64 measured on the H200.
        decode_block_n: key columns per decode-kernel tile (a power of two, 16-256).
        decode_stages: software-pipeline stages of the decode kernel's tile loop.
        flex_kernel_options: Triton tile options of the compiled FlexAttention kernel as
            (name, value) pairs, e.g. (("BLOCK_M", 64), ("BLOCK_N", 64)); None lets Inductor choose
            (with a fallback for shapes it finds no kernel for, `flex.FALLBACK_KERNEL_OPTIONS`).
        bd3lm_backward: the backward variant of the `bd3lm_kernel` attention backend
            (`kernels.bd3lm_options.BACKWARD_VARIANTS`: split, one_launch, chunked, fused; all
            exact, `chunked` and `fused` sum float32 atomics so they are not bitwise repeatable).
        bd3lm_dkdv_chunk: query tiles per dK/dV program of the `chunked` and `fused` variants.
    """

    fused: bool = True
    decode_attention: bool = True
    decode_span: bool = True
    decode_splits: int = 1
    decode_max_rows: int = 64
    decode_block_n: int = 128
    decode_stages: int = 2
    flex_kernel_options: tuple[tuple[str, int], ...] | None = None
    bd3lm_backward: str = "one_launch"
    bd3lm_dkdv_chunk: int = 16

    def __post_init__(self) -> None:
        if self.bd3lm_backward not in BACKWARD_VARIANTS:
            raise ValueError(f"kernels.bd3lm_backward={self.bd3lm_backward!r}: choose one of {BACKWARD_VARIANTS}")
        if self.bd3lm_dkdv_chunk < 1:
            raise ValueError(f"kernels.bd3lm_dkdv_chunk must be >= 1 (query tiles per dK/dV program, e.g. 16), "
                             f"got {self.bd3lm_dkdv_chunk}")
        for name, low in (("decode_splits", 1), ("decode_max_rows", 1), ("decode_stages", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"kernels.{name} must be >= {low}, got {getattr(self, name)}")
        if self.decode_max_rows > 128:
            raise ValueError(f"kernels.decode_max_rows must be <= 128 (the kernel's largest tile), "
                             f"got {self.decode_max_rows}")
        n = self.decode_block_n
        if n < 16 or n > 256 or n & (n - 1):
            raise ValueError(f"kernels.decode_block_n must be a power of two in [16, 256], got {n}")
        if self.flex_kernel_options is not None:
            pairs = self.flex_kernel_options
            if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
                raise ValueError(f"kernels.flex_kernel_options must be (name, value) pairs such as "
                                 f"(('BLOCK_M', 64), ('BLOCK_N', 64)), or None; got {pairs!r}")

    @property
    def flex_options(self) -> dict[str, int] | None:
        """`flex_kernel_options` as the dict `flex_attention(kernel_options=...)` takes (None: Inductor's choice)."""
        return None if self.flex_kernel_options is None else dict(self.flex_kernel_options)

    @property
    def bd3lm_options(self) -> BD3LMKernelOptions:
        """The `bd3lm_kernel` backend's options (its tiles: `GPU_TILING` / `INTERPRETER_TILING`)."""
        return BD3LMKernelOptions(backward=self.bd3lm_backward, dkdv_chunk=self.bd3lm_dkdv_chunk)

    def use_fused(self, x: torch.Tensor) -> bool:
        """Whether an op on `x` takes the fused path."""
        return self.fused and runs_on(x)


def set_kernels(model: nn.Module, kernels: KernelConfig) -> nn.Module:
    """Make `model` (a dllm_models family) run with `kernels` from now on; returns it.

    Raises:
        TypeError: `model` is not a family (it has no `kernels` to set) or `kernels` is no KernelConfig.
    """
    if not isinstance(kernels, KernelConfig):
        raise TypeError(f"kernels must be a dllm_models.KernelConfig, got {type(kernels).__name__}")
    if not isinstance(getattr(model, "kernels", None), KernelConfig):
        raise TypeError(f"{type(model).__name__} is not a dllm_models family (it has no `kernels`); "
                        "build it with dllm_models.load_model or build_model")
    setattr(model, "kernels", kernels)
    return model


PLAIN = KernelConfig(fused=False)
"""The plain PyTorch path for the elementwise ops (the default of every layer called on its own)."""

DEFAULT_KERNELS = KernelConfig()
"""A model's default: every kernel on (fused elementwise ops on CUDA, the decode kernel with its span walk)."""


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

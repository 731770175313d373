"""SwiGLU `silu(gate) * up` in one pass forward and one backward (float32 math in registers).

Numerics follow `layers.swiglu` in the input dtype: silu rounds to the dtype, then the product
rounds (`F.silu(gate) * up`). The backward reads gate, up and dy once and writes both gradients.
Set TRITON_INTERPRET=1 before importing to run them on CPU (tests).
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_models.kernels.logsumexp import HAS_TRITON

_BLOCK = 1024

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _swiglu_fwd(G, U, Y, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
        tl.store(Y + offs, (act * u).to(Y.dtype.element_ty), mask=ok)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _swiglu_bwd(G, U, DY, DG, DU, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-g))
        act = (g * sig).to(G.dtype.element_ty).to(tl.float32)
        tl.store(DU + offs, (dy * act).to(DU.dtype.element_ty), mask=ok)
        tl.store(DG + offs, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(DG.dtype.element_ty), mask=ok)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1) if x.is_contiguous() else x.contiguous().reshape(-1)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        g, u = _flat(gate), _flat(up)
        y = torch.empty_like(g)
        if g.numel():
            kernel: Any = _swiglu_fwd
            kernel[(triton.cdiv(g.numel(), _BLOCK),)](g, u, y, g.numel(), BLOCK=_BLOCK)
        ctx.save_for_backward(g, u)
        ctx.shape = gate.shape
        return y.view(gate.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, u = ctx.saved_tensors
        d = _flat(dy)
        dg, du = torch.empty_like(g), torch.empty_like(u)
        if g.numel():
            kernel: Any = _swiglu_bwd
            kernel[(triton.cdiv(g.numel(), _BLOCK),)](g, u, d, dg, du, g.numel(), BLOCK=_BLOCK)
        return dg.view(ctx.shape), du.view(ctx.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Fused `silu(gate) * up` for gate, up of one shape and dtype; same shape and dtype out."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use dllm_models.layers.swiglu")
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(
            f"gate and up must share shape and dtype; got {tuple(gate.shape)} {gate.dtype} and "
            f"{tuple(up.shape)} {up.dtype}"
        )
    out: torch.Tensor = _SwiGLU.apply(gate, up)
    return out

"""RMSNorm over the last dim, optionally fused with the residual add before it.

One memory pass forward (read x [and the residual], write y [and the sum]) and one backward
(read x, dy [and the residual stream's gradient], write dx and per-program weight-gradient
partials), against ~8 float32 elementwise kernels each way on the plain path. Numerics follow
`dllm_models.layers.RMSNorm`: float32 statistics, and either round-then-scale (LLaDA, Dream,
LLaDA2: `round(round(x * rstd) * w)`) or scale-then-round (SDAR: `round(x * rstd * w)`).
Set TRITON_INTERPRET=1 before importing to run them on CPU (tests).
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_models.kernels.logsumexp import HAS_TRITON

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _rms_fwd(  # type: ignore[no-untyped-def]
        X, R, S, Y, W, RSTD, stride_x, stride_r, stride_s, stride_y, n_cols, eps,
        HAS_RES: tl.constexpr, SCALE_FP32: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
        if HAS_RES:
            r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
            tl.store(S + row * stride_s + cols, x, mask=ok)
        x32 = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x32 * x32, axis=0) / n_cols + eps)
        tl.store(RSTD + row, rstd)
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        n = x32 * rstd
        if SCALE_FP32:
            y = n * w
        else:
            y = n.to(X.dtype.element_ty).to(tl.float32) * w
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=ok)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _rms_bwd(  # type: ignore[no-untyped-def]
        X, W, RSTD, DY, DS, DX, DW, stride_x, stride_dy, stride_ds, stride_dx, n_rows, n_cols,
        rows_per_prog, HAS_DS: tl.constexpr, SCALE_FP32: tl.constexpr, BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        start = pid.to(tl.int64) * rows_per_prog
        for i in range(0, tl.minimum(rows_per_prog, n_rows - start)):
            row = start + i
            x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            n = x * rstd
            if SCALE_FP32:
                dw += dy * n
            else:
                dw += dy * n.to(X.dtype.element_ty).to(tl.float32)
            g = dy * w
            dx = (g - n * (tl.sum(g * n, axis=0) / n_cols)) * rstd
            if HAS_DS:
                dx += tl.load(DS + row * stride_ds + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=ok)
        tl.store(DW + pid * n_cols + cols, dw, mask=ok)


def launch_settings(block: int) -> int:
    """num_warps for a row of `block` elements (Liger/Unsloth's rule)."""
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def programs_for(n_rows: int, device: torch.device) -> int:
    """Programs of a row-looping backward: a few per SM on CUDA (bounded partials), else 64."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 16
    return max(1, min(n_rows, 4 * sms))


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _forward(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, scale_fp32: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(y, x + residual or None, rstd [N] float32), y and the sum in x's shape and dtype."""
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    r2 = _rows(residual) if residual is not None else x2
    s2 = torch.empty_like(x2) if residual is not None else x2
    y2 = torch.empty_like(x2)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows:
        block = triton.next_power_of_2(n_cols)
        kernel: Any = _rms_fwd
        kernel[(n_rows,)](
            x2, r2, s2, y2, weight, rstd, x2.stride(0), r2.stride(0), s2.stride(0), y2.stride(0),
            n_cols, eps, HAS_RES=residual is not None, SCALE_FP32=scale_fp32, BLOCK=block,
            num_warps=launch_settings(block),
        )
    s = s2.view(x.shape) if residual is not None else None
    return y2.view(x.shape), s, rstd


def _backward(
    normed_input: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor,
    ds: torch.Tensor | None, scale_fp32: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx [x's shape], dweight [D]) of y = rmsnorm(x) (+ the residual stream's gradient ds)."""
    x2 = _rows(normed_input)
    dy2 = _rows(dy)
    ds2 = _rows(ds) if ds is not None else dy2
    n_rows, n_cols = x2.shape
    dx2 = torch.empty_like(x2)
    progs = programs_for(n_rows, x2.device)
    dw = torch.zeros((progs, n_cols), dtype=torch.float32, device=x2.device)
    if n_rows:
        block = triton.next_power_of_2(n_cols)
        kernel: Any = _rms_bwd
        kernel[(progs,)](
            x2, weight, rstd, dy2, ds2, dx2, dw, x2.stride(0), dy2.stride(0), ds2.stride(0),
            dx2.stride(0), n_rows, n_cols, triton.cdiv(n_rows, progs), HAS_DS=ds is not None,
            SCALE_FP32=scale_fp32, BLOCK=block, num_warps=min(16, 2 * launch_settings(block)),
        )
    return dx2.view(normed_input.shape), dw.sum(0).to(weight.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, scale_fp32: bool) -> torch.Tensor:
        y, _, rstd = _forward(x, None, weight, eps, scale_fp32)
        ctx.save_for_backward(x, weight, rstd)
        ctx.scale_fp32 = scale_fp32
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(x, weight, rstd, dy, None, ctx.scale_fp32)
        return dx, dw, None, None


class _AddRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, scale_fp32: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        y, s, rstd = _forward(x, residual, weight, eps, scale_fp32)
        assert s is not None
        ctx.save_for_backward(s, weight, rstd)
        ctx.scale_fp32 = scale_fp32
        return y, s

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, ds: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        s, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(s, weight, rstd, dy, ds, ctx.scale_fp32)
        return dx, dx, dw, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, scale_in_fp32: bool) -> torch.Tensor:
    """Fused RMSNorm of x [..., D] with weight [D]; same dtype as x (see the module docstring)."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use dllm_models.layers.RMSNorm")
    out: torch.Tensor = _RMSNorm.apply(x, weight, eps, scale_in_fp32)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, scale_in_fp32: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual), x + residual), the sum rounded to x's dtype first (as `x + r`).

    Args:
        x, residual: [..., D], same shape and dtype.
        weight: [D]; eps: variance epsilon; scale_in_fp32: SDAR's scale-then-round numerics.
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use dllm_models.layers.RMSNorm")
    y, s = _AddRMSNorm.apply(x, residual, weight, eps, scale_in_fp32)
    return y, s

"""Rotate-half RoPE on the first `rotary_dim` dims of each head, optionally after a per-head RMSNorm.

One program per token handles all of its heads: read q (or k) [B, L, H, D] once (any token and
head strides, e.g. a split of a fused QKV projection), normalise each head (SDAR/Qwen3 and
LLaDA2's q/k norm), rotate, write [B, L, H, D] contiguous (the attention layout is its
`transpose(1, 2)`). Backward rotates the gradient back, then runs the norm's backward, in one
pass; the weight gradient is reduced from per-program partials.

Numerics follow `dllm_models.layers`: the norm rounds to the input dtype as `RMSNorm` does; with
`full_precision` the rotation runs in float32 and rounds once (LLaDA), otherwise cos/sin are
rounded to the input dtype and every product and the sum round as in `apply_rope` (Dream, SDAR,
LLaDA2). Set TRITON_INTERPRET=1 before importing to run them on CPU (tests).
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_models.kernels.logsumexp import HAS_TRITON
from dllm_models.kernels.rmsnorm import programs_for

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _rnd(x, P):  # type: ignore[no-untyped-def]
        """x rounded to the element dtype of pointer P, back in float32."""
        return x.to(P.dtype.element_ty).to(tl.float32)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _norm_rope_fwd(  # type: ignore[no-untyped-def]
        X, Y, W, COS, SIN, RSTD, sxb, sxl, sxh, seq_len, n_heads, head_dim, cs_stride, eps,
        HALF: tl.constexpr, HAS_NORM: tl.constexpr, SCALE_FP32: tl.constexpr,
        FULL_PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
        BLOCK_PASS: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, BLOCK_H)[:, None]
        c1 = tl.arange(0, BLOCK_HALF)[None, :]
        cp = tl.arange(0, BLOCK_PASS)[None, :]
        m1 = (heads < n_heads) & (c1 < HALF)
        mp = (heads < n_heads) & (cp < head_dim - 2 * HALF)
        src = X + (t // seq_len) * sxb + (t % seq_len) * sxl + heads * sxh
        x1 = tl.load(src + c1, mask=m1, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF + c1, mask=m1, other=0.0).to(tl.float32)
        xp = tl.load(src + 2 * HALF + cp, mask=mp, other=0.0).to(tl.float32)
        if HAS_NORM:
            ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1) + tl.sum(xp * xp, axis=1)
            rstd = 1.0 / tl.sqrt_rn(ss / head_dim + eps)
            tl.store(RSTD + t * n_heads + tl.arange(0, BLOCK_H), rstd, mask=tl.arange(0, BLOCK_H) < n_heads)
            w1 = tl.load(W + c1, mask=c1 < HALF, other=0.0).to(tl.float32)
            w2 = tl.load(W + HALF + c1, mask=c1 < HALF, other=0.0).to(tl.float32)
            wp = tl.load(W + 2 * HALF + cp, mask=cp < head_dim - 2 * HALF, other=0.0).to(tl.float32)
            r = rstd[:, None]
            if SCALE_FP32:
                x1, x2, xp = _rnd(x1 * r * w1, X), _rnd(x2 * r * w2, X), _rnd(xp * r * wp, X)
            else:
                x1 = _rnd(_rnd(x1 * r, X) * w1, X)
                x2 = _rnd(_rnd(x2 * r, X) * w2, X)
                xp = _rnd(_rnd(xp * r, X) * wp, X)
        cos = tl.load(COS + t * cs_stride + c1, mask=c1 < HALF, other=0.0)
        sin = tl.load(SIN + t * cs_stride + c1, mask=c1 < HALF, other=0.0)
        if FULL_PREC:
            y1 = x1 * cos - x2 * sin
            y2 = x2 * cos + x1 * sin
        else:
            cos, sin = _rnd(cos, X), _rnd(sin, X)
            y1 = _rnd(x1 * cos, X) - _rnd(x2 * sin, X)
            y2 = _rnd(x2 * cos, X) + _rnd(x1 * sin, X)
        dst = Y + t * n_heads * head_dim + heads * head_dim
        tl.store(dst + c1, y1.to(Y.dtype.element_ty), mask=m1)
        tl.store(dst + HALF + c1, y2.to(Y.dtype.element_ty), mask=m1)
        tl.store(dst + 2 * HALF + cp, xp.to(Y.dtype.element_ty), mask=mp)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _norm_rope_bwd(  # type: ignore[no-untyped-def]
        X, DY, DX, W, DW, COS, SIN, RSTD, sxb, sxl, sxh, sdb, sdl, sdh, n_tokens, seq_len,
        n_heads, head_dim, cs_stride, tokens_per_prog,
        HALF: tl.constexpr, HAS_NORM: tl.constexpr, SCALE_FP32: tl.constexpr,
        FULL_PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
        BLOCK_PASS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        heads = tl.arange(0, BLOCK_H)[:, None]
        c1 = tl.arange(0, BLOCK_HALF)[None, :]
        cp = tl.arange(0, BLOCK_PASS)[None, :]
        m1 = (heads < n_heads) & (c1 < HALF)
        mp = (heads < n_heads) & (cp < head_dim - 2 * HALF)
        dw1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        dw2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        dwp = tl.zeros([BLOCK_PASS], dtype=tl.float32)
        if HAS_NORM:
            w1 = tl.load(W + c1, mask=c1 < HALF, other=0.0).to(tl.float32)
            w2 = tl.load(W + HALF + c1, mask=c1 < HALF, other=0.0).to(tl.float32)
            wp = tl.load(W + 2 * HALF + cp, mask=cp < head_dim - 2 * HALF, other=0.0).to(tl.float32)
        start = pid.to(tl.int64) * tokens_per_prog
        for i in range(0, tl.minimum(tokens_per_prog, n_tokens - start)):
            t = start + i
            b, pos = t // seq_len, t % seq_len
            gsrc = DY + b * sdb + pos * sdl + heads * sdh
            g1 = tl.load(gsrc + c1, mask=m1, other=0.0).to(tl.float32)
            g2 = tl.load(gsrc + HALF + c1, mask=m1, other=0.0).to(tl.float32)
            gp = tl.load(gsrc + 2 * HALF + cp, mask=mp, other=0.0).to(tl.float32)
            cos = tl.load(COS + t * cs_stride + c1, mask=c1 < HALF, other=0.0)
            sin = tl.load(SIN + t * cs_stride + c1, mask=c1 < HALF, other=0.0)
            if not FULL_PREC:
                cos, sin = _rnd(cos, X), _rnd(sin, X)
            dx1 = g1 * cos + g2 * sin
            dx2 = g2 * cos - g1 * sin
            if HAS_NORM:
                src = X + b * sxb + pos * sxl + heads * sxh
                rstd = tl.load(RSTD + t * n_heads + tl.arange(0, BLOCK_H), mask=tl.arange(0, BLOCK_H) < n_heads, other=0.0)[:, None]
                n1 = tl.load(src + c1, mask=m1, other=0.0).to(tl.float32) * rstd
                n2 = tl.load(src + HALF + c1, mask=m1, other=0.0).to(tl.float32) * rstd
                n_p = tl.load(src + 2 * HALF + cp, mask=mp, other=0.0).to(tl.float32) * rstd
                if SCALE_FP32:
                    dw1 += tl.sum(dx1 * n1, axis=0)
                    dw2 += tl.sum(dx2 * n2, axis=0)
                    dwp += tl.sum(gp * n_p, axis=0)
                else:
                    dw1 += tl.sum(dx1 * _rnd(n1, X), axis=0)
                    dw2 += tl.sum(dx2 * _rnd(n2, X), axis=0)
                    dwp += tl.sum(gp * _rnd(n_p, X), axis=0)
                dx1, dx2, gp = dx1 * w1, dx2 * w2, gp * wp
                dot = tl.sum(dx1 * n1, axis=1) + tl.sum(dx2 * n2, axis=1) + tl.sum(gp * n_p, axis=1)
                c = (dot / head_dim)[:, None]
                dx1 = (dx1 - n1 * c) * rstd
                dx2 = (dx2 - n2 * c) * rstd
                gp = (gp - n_p * c) * rstd
            dst = DX + t * n_heads * head_dim + heads * head_dim
            tl.store(dst + c1, dx1.to(DX.dtype.element_ty), mask=m1)
            tl.store(dst + HALF + c1, dx2.to(DX.dtype.element_ty), mask=m1)
            tl.store(dst + 2 * HALF + cp, gp.to(DX.dtype.element_ty), mask=mp)
        if HAS_NORM:
            base = DW + pid * head_dim
            tl.store(base + tl.arange(0, BLOCK_HALF), dw1, mask=tl.arange(0, BLOCK_HALF) < HALF)
            tl.store(base + HALF + tl.arange(0, BLOCK_HALF), dw2, mask=tl.arange(0, BLOCK_HALF) < HALF)
            tl.store(
                base + 2 * HALF + tl.arange(0, BLOCK_PASS), dwp,
                mask=tl.arange(0, BLOCK_PASS) < head_dim - 2 * HALF,
            )


def _meta(x: torch.Tensor, half: int, backward: bool) -> dict[str, Any]:
    _, _, h, d = x.shape
    block_h = triton.next_power_of_2(h)
    # ptxas on sm_90: 32 heads x 128 spill at 4 warps backward; 8 (fwd) / 16 (bwd) do not
    per_warp = 256 if backward else 512
    return {
        "HALF": half,
        "BLOCK_H": block_h,
        "BLOCK_HALF": triton.next_power_of_2(half),
        "BLOCK_PASS": triton.next_power_of_2(max(d - 2 * half, 1)),
        "num_warps": max(4, min(16, block_h * triton.next_power_of_2(d) // per_warp)),
    }


def _tables(cos: torch.Tensor, sin: torch.Tensor, b: int, n: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B or 1, 1, L, R] float32 -> [B * L, >= R/2] row tables (first half read)."""
    c = cos[:, 0, :, :half].expand(b, n, half).reshape(b * n, half)
    s = sin[:, 0, :, :half].expand(b, n, half).reshape(b * n, half)
    return c.float(), s.float()


class _NormRope(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
        eps: float, scale_fp32: bool, full_precision: bool,
    ) -> torch.Tensor:
        b, n, h, d = x.shape
        half = cos.shape[-1] // 2
        c, s = _tables(cos, sin, b, n, half)
        y = torch.empty((b, n, h, d), dtype=x.dtype, device=x.device)
        rstd = torch.empty((b * n * h if weight is not None else 1), dtype=torch.float32, device=x.device)
        if b * n:
            kernel: Any = _norm_rope_fwd
            kernel[(b * n,)](
                x, y, weight if weight is not None else c, c, s, rstd,
                x.stride(0), x.stride(1), x.stride(2), n, h, d, c.stride(0), eps,
                HAS_NORM=weight is not None, SCALE_FP32=scale_fp32, FULL_PREC=full_precision,
                **_meta(x, half, False),
            )
        ctx.save_for_backward(x if weight is not None else None, weight, c, s, rstd)
        ctx.conf = (x.shape, x.dtype, half, scale_fp32, full_precision)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, c, s, rstd = ctx.saved_tensors
        shape, dtype, half, scale_fp32, full_precision = ctx.conf
        b, n, h, d = shape
        if dy.stride(-1) != 1:
            dy = dy.contiguous()
        dx = torch.empty(shape, dtype=dtype, device=dy.device)
        progs = programs_for(b * n, dy.device)
        dw = torch.zeros((progs, d) if weight is not None else (1,), dtype=torch.float32, device=dy.device)
        src = x if x is not None else dy
        if b * n:
            kernel: Any = _norm_rope_bwd
            kernel[(progs,)](
                src, dy, dx, weight if weight is not None else c, dw, c, s, rstd,
                src.stride(0), src.stride(1), src.stride(2), dy.stride(0), dy.stride(1), dy.stride(2),
                b * n, n, h, d, c.stride(0), triton.cdiv(b * n, progs),
                HAS_NORM=weight is not None, SCALE_FP32=scale_fp32, FULL_PREC=full_precision,
                **_meta(dx, half, True),
            )
        dweight = dw.sum(0).to(weight.dtype) if weight is not None else None
        return dx, dweight, None, None, None, None, None


def norm_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    scale_in_fp32: bool = False,
    full_precision: bool = False,
) -> torch.Tensor:
    """Per-head RMSNorm (when `weight` is given) then rotate-half RoPE, fused.

    Args:
        x: [B, L, H, D] (the last dim contiguous; other strides free).
        cos, sin: [B or 1, 1, L, R] float32 tables of `layers.rope_cos_sin` (R <= D rotated dims).
        weight: [D] norm scale, or None for RoPE alone; eps: the norm's epsilon.
        scale_in_fp32: SDAR's scale-then-round norm numerics.
        full_precision: rotate in float32 and round once (LLaDA).

    Returns:
        [B, L, H, D] contiguous, x's dtype.
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use dllm_models.layers.apply_rope")
    if x.dim() != 4 or x.stride(-1) != 1 or cos.shape[-1] % 2 or cos.shape[-1] > x.shape[-1]:
        raise ValueError(
            f"x must be [B, L, H, D] with a contiguous last dim and cos [.., R] with even R <= D; "
            f"got x {tuple(x.shape)} (strides {x.stride()}), cos {tuple(cos.shape)}"
        )
    out: torch.Tensor = _NormRope.apply(x, weight, cos, sin, eps, scale_in_fp32, full_precision)
    return out

"""Row-wise log-sum-exp with target gather, and the matching in-place log-prob gradient.

These are the two memory-bound halves of the chunked fused log-prob (`dllm_models.logprob`):
the matmul producing a chunk of logits [C, V] stays on cuBLAS, and these kernels read the logits
once in their own dtype (float32 math in registers), so no float32 copy of the chunk is made.
Set TRITON_INTERPRET=1 before importing to run them on CPU (tests).
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    HAS_TRITON = True
except ImportError:  # pragma: no cover - Triton ships with CUDA torch builds
    HAS_TRITON = False

_BLOCK_V = 4096
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(x: torch.Tensor) -> bool:
    """Whether a Triton kernel can run on `x`: a CUDA tensor with Triton installed, or a CPU tensor
    under TRITON_INTERPRET=1 (the interpreter, for tests)."""
    return HAS_TRITON and (x.is_cuda or (_INTERPRET and x.device.type == "cpu"))


if HAS_TRITON:

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _lse_target_kernel(  # type: ignore[no-untyped-def]
        logits_ptr, targets_ptr, lse_ptr, tgt_ptr, stride_row, n_cols, inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride_row
        target = tl.load(targets_ptr + row)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            x = x * inv_temp
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        tl.store(lse_ptr + row, m + tl.log(s))
        safe = tl.where(target >= 0, target, 0)
        t = tl.load(base + safe).to(tl.float32) * inv_temp
        tl.store(tgt_ptr + row, t)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _grad_kernel(  # type: ignore[no-untyped-def]
        logits_ptr, targets_ptr, lse_ptr, gout_ptr, stride_row, n_cols, inv_temp,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = cols < n_cols
        ptr = logits_ptr + row * stride_row + cols
        x = tl.load(ptr, mask=ok, other=0.0).to(tl.float32) * inv_temp
        lse = tl.load(lse_ptr + row)
        g = tl.load(gout_ptr + row) * inv_temp
        target = tl.load(targets_ptr + row)
        onehot = tl.where(cols == target, 1.0, 0.0)
        d = g * (onehot - tl.exp(x - lse))
        tl.store(ptr, d.to(logits_ptr.dtype.element_ty), mask=ok)


def _check(logits: torch.Tensor, targets: torch.Tensor) -> None:
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use dllm_models.logprob with backend='chunked'")
    if logits.dim() != 2 or logits.stride(1) != 1 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be a row-contiguous [C, V] tensor and targets [C]; got "
            f"{tuple(logits.shape)} (strides {logits.stride()}) and {tuple(targets.shape)}"
        )


def lse_and_target(
    logits: torch.Tensor, targets: torch.Tensor, inv_temp: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp(x * inv_temp), x[target] * inv_temp) per row, float32 [C] each.

    Args:
        logits: [C, V] (any float dtype, row-contiguous).
        targets: long [C]; negative targets read column 0 (callers mask them).
        inv_temp: 1 / temperature.
    """
    _check(logits, targets)
    c, v = logits.shape
    lse = torch.empty(c, dtype=torch.float32, device=logits.device)
    tgt = torch.empty(c, dtype=torch.float32, device=logits.device)
    if c:
        kernel: Any = _lse_target_kernel
        kernel[(c,)](logits, targets, lse, tgt, logits.stride(0), v, inv_temp, BLOCK_V=_BLOCK_V)
    return lse, tgt


def logprob_grad_(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
    inv_temp: float,
) -> torch.Tensor:
    """Overwrite logits [C, V] with d(sum g * logprob)/d logits = g/T * (onehot - softmax(x/T)).

    Args:
        logits: [C, V] raw logits, overwritten in place (its dtype is kept).
        targets: long [C]; lse: float32 [C] from `lse_and_target`; grad_out: float32 [C]
            (zero on ignored rows).
        inv_temp: 1 / temperature.

    Returns:
        `logits`, now holding the gradient.
    """
    _check(logits, targets)
    c, v = logits.shape
    if c:
        kernel: Any = _grad_kernel
        grid = (c, triton.cdiv(v, _BLOCK_V))
        kernel[grid](logits, targets, lse, grad_out, logits.stride(0), v, inv_temp, BLOCK_V=_BLOCK_V)
    return logits

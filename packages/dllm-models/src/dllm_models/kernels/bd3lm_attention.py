"""Attention of the BD3LM training layout, forward and backward, visiting only the visible tiles.

The shared-clean layout [x_0 ; x_t^1 ; ... ; x_t^k] (`dllm_models.attention.bd3lm_mask`) is
mostly invisible: a noisy query sees the clean keys before its block plus its own block (4 keys
for SDAR, 32 for LLaDA2), a clean query the clean keys up to its block's end. A generic block
mask walks every tile that holds some visible pair and evaluates a mask function there; here the
tiles come from `bd3lm_schedule` (each query's visible keys are two intervals, computed
analytically, cut to tiles), a tile where every pair is visible runs without any mask, and the
others mask element-wise from four int32 ids per position (segment, block, copy). Block lengths
are independent of the tile sizes: a tile of 64 queries spans 16 SDAR blocks, masked inside.

Forward (`bd3lm_forward`): one program per (query head, query tile) keeps FlashAttention's online
softmax in float32 (Dao, arXiv 2307.08691) over the query tile's key tiles and stores the output
and the log-sum-exp. Backward (`bd3lm_backward`): dK/dV programs per key tile (grouped query
heads inside, without atomics unless the walk is cut) and dQ programs per query tile, programs
started in order of decreasing work.

Variants of the backward (`BD3LMKernelOptions.backward`, see `bd3lm_options`): `split` (two
launches, FlashAttention-2), `one_launch` (the default: both kinds of program in one grid, as
flex's backward; the fastest measured on the H200, 4.44 ms forward + backward against flex's 5.72 at
SDAR-8B's shape, and bitwise repeatable), `chunked` (the long dK/dV walks of the clean key tiles cut into pieces of
`dkdv_chunk` query tiles, summed by float32 atomics, in one grid with the dQ programs), `fused`
(chunked dK/dV programs that also add dQ by atomics, FlashAttention-3). All four are exact
(float64 interpreter tests; bf16 within twice flex's error on the H200); measured by
`benchmarks/bd3lm_attention_bench.py --bwd-variants ...` (docs/benchmarks.md). Set TRITON_INTERPRET=1 before importing to run on CPU (tests).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from dllm_models.kernels.bd3lm_backward import dkdv_items, launch_backward
from dllm_models.kernels.bd3lm_forward import launch_forward
from dllm_models.kernels.bd3lm_options import (
    BACKWARD_VARIANTS,
    GPU_TILING,
    INTERPRETER_TILING,
    BD3LMKernelOptions,
    Tile,
    Tiling,
)
from dllm_models.kernels.bd3lm_schedule import PositionIds, Schedule, build_schedule, position_ids
from dllm_models.kernels.logsumexp import runs_on
from dllm_models.mask import AttentionMask


class Plan(NamedTuple):
    """What the kernels walk for one row and one set of options (built once per mask, `plan`).

    Attributes:
        forward, dkdv, dq: the three kernels' schedules (`bd3lm_schedule.build_schedule` per tile).
        items: int32 [I, 3] the dK/dV programs' pieces (`bd3lm_backward.dkdv_items`).
        tiling: the tiles the schedules were built for.
    """

    forward: Schedule
    dkdv: Schedule
    dq: Schedule
    items: torch.Tensor
    tiling: Tiling


def plan(ids: PositionIds, options: BD3LMKernelOptions, *, on_cuda: bool, padded_keys: bool) -> Plan:
    """The schedules and dK/dV pieces of a row under `options` (tiles resolved for the device)."""
    tiling = options.resolved(on_cuda)
    f, kv, q = (build_schedule(ids, t.block_m, t.block_n, padded_keys=padded_keys) for t in tiling.tiles())
    items = dkdv_items(kv, options.dkdv_chunk if options.chunked else None)
    return Plan(f, kv, q, items, tiling)


class _BD3LMAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds, kernel_plan: Plan,
                options: BD3LMKernelOptions) -> torch.Tensor:
        out, lse = launch_forward(q, k, v, ids, kernel_plan.forward, kernel_plan.tiling.forward)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ids, ctx.plan, ctx.options = ids, kernel_plan, options
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        p: Plan = ctx.plan
        dq, dk, dv = launch_backward(q, k, v, out, lse, grad, ctx.ids, (p.dkdv, p.dq), p.items, ctx.options, p.tiling)
        return dq, dk, dv, None, None, None


def bd3lm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds, kernel_plan: Plan,
                    options: BD3LMKernelOptions) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the BD3LM-visible keys of one packed row, differentiable.

    Args:
        q: [Hq, N, D] queries (any strides; Hq a multiple of Hkv; D a power of two >= 16).
        k, v: [Hkv, N, D].
        ids: `bd3lm_schedule.position_ids` of the row's mask.
        kernel_plan: `plan(ids, options, ...)`.
        options: the backward variant (and the tiles `kernel_plan` was built for).

    Returns:
        [Hq, N, D] in q's dtype (a transposed view of [N, Hq, D] memory); a query that sees no
        key gets zeros.
    """
    out: torch.Tensor = _BD3LMAttention.apply(q, k, v, ids, kernel_plan, options)
    return out


def bd3lm_fits(q: torch.Tensor, k: torch.Tensor, mask: AttentionMask) -> bool:
    """Whether `bd3lm_attend` serves q [B, Hq, Lq, D] over k [B, Hkv, Lk, D] under `mask`.

    One packed row (B = 1) without a KV cache (Lq = Lk), a block mask (BD3LM or block-causal),
    no key limit, a power-of-two head size of 16 to 256, grouped heads, and a device the kernel
    runs on (CUDA, or the CPU under TRITON_INTERPRET=1).
    """
    b, hq, lq, d = q.shape
    return (runs_on(q) and b == 1 and lq == k.shape[2] and mask.block_ids is not None and mask.key_limit is None
            and d in (16, 32, 64, 128, 256) and hq % k.shape[1] == 0
            and q.dtype in (torch.bfloat16, torch.float16, torch.float32))


def bd3lm_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *,
                 options: BD3LMKernelOptions | None = None) -> torch.Tensor:
    """`bd3lm_attention` of q [1, Hq, N, D] over k, v [1, Hkv, N, D] under `mask` (see `bd3lm_fits`).

    The position ids and the plan are built once per mask and options (memoised on `mask.cache`,
    shared by every layer and by checkpoint recomputation). `options` None: `BD3LMKernelOptions()`
    (the `one_launch` backward, `GPU_TILING` on CUDA, `INTERPRETER_TILING` on the CPU).
    """
    n = q.shape[2]
    options = BD3LMKernelOptions() if options is None else options
    key = ("bd3lm_kernel", n, options, str(q.device))
    if key not in mask.cache:
        ids = position_ids(mask, n, q.device)
        mask.cache[key] = (ids, plan(ids, options, on_cuda=q.is_cuda, padded_keys=mask.key_padding is not None))
    ids, kernel_plan = mask.cache[key]
    return bd3lm_attention(q[0], k[0], v[0], ids, kernel_plan, options)[None]


__all__ = ["BACKWARD_VARIANTS", "GPU_TILING", "INTERPRETER_TILING", "BD3LMKernelOptions", "Plan", "Tile", "Tiling",
           "bd3lm_attend", "bd3lm_attention", "bd3lm_fits", "plan"]

"""Attention of the BD3LM training layout, forward and backward, visiting only the visible tiles.

The shared-clean layout [x_0 ; x_t^1 ; ... ; x_t^k] (`dllm_models.attention.bd3lm_mask`) is
mostly invisible: a noisy query sees the clean keys before its block plus its own block (4 keys
for SDAR, 32 for LLaDA2), a clean query the clean keys up to its block's end. A generic block
mask walks every tile that holds some visible pair and evaluates a mask function there; here the
tiles come from `bd3lm_schedule` (each query's visible keys are two intervals, computed
analytically, cut to tiles), a tile where every pair is visible runs without any mask, and the
others mask element-wise from four int32 ids per position (segment, block, copy). Block lengths
are independent of the tile sizes: a tile of 64 queries spans 16 SDAR blocks, masked inside.

Forward: one program per (query head, query tile) keeps FlashAttention's online softmax in
float32 (Dao, arXiv 2307.08691) over the query tile's key tiles and stores the output and the
log-sum-exp. Backward (FlashAttention-2's split): one program per (KV head, key tile) walks the
query tiles that see the key tile, for each of the KV head's n_rep query heads (grouped query
attention without atomics), accumulating dK and dV; one program per (query head, query tile)
recomputes dQ over its key tiles. Programs start in order of decreasing work, the heads of a
tile together (`Schedule.q_order`, `k_order`). Set TRITON_INTERPRET=1 before importing to run on CPU (tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dllm_models.kernels.bd3lm_schedule import PositionIds, Schedule, build_schedule, position_ids
from dllm_models.kernels.logsumexp import HAS_TRITON, runs_on

from dllm_models.mask import AttentionMask

LOG2E = 1.4426950408889634

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _visible(qseg, qblk, qcp, rows, kseg_ptr, blk_ptr, cp_ptr, cols, n):  # type: ignore[no-untyped-def]
        """bool [M, N]: key `cols` is visible to query `rows` (`bd3lm_schedule.visible_reference`)."""
        inside = cols < n
        kseg = tl.load(kseg_ptr + cols, mask=inside, other=-2)
        kblk = tl.load(blk_ptr + cols, mask=inside, other=0)
        kcp = tl.load(cp_ptr + cols, mask=inside, other=-1)
        q_clean = (qcp == 0).to(tl.int32)
        clean_key = (kcp[None, :] == 0) & (kblk[None, :] < qblk[:, None] + q_clean[:, None])
        own_block = (kcp[None, :] == qcp[:, None]) & (qcp[:, None] != 0) & (kblk[None, :] == qblk[:, None])
        same = (kseg[None, :] == qseg[:, None]) & (rows[:, None] < n)
        return same & (clean_key | own_block)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _fwd_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qseg_ptr, kseg_ptr, blk_ptr, cp_ptr, num_ptr, idx_ptr, full_ptr,
        order_ptr, qk_scale, n, n_rep, width, sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, soh, som, sod,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        qt = tl.load(order_ptr + tl.program_id(1))
        h = tl.program_id(0).to(tl.int64)
        hk = h // n_rep
        rows = qt * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        inside = rows < n
        q = tl.load(q_ptr + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=inside[:, None], other=0.0)
        qseg = tl.load(qseg_ptr + rows, mask=inside, other=-3)
        qblk = tl.load(blk_ptr + rows, mask=inside, other=0)
        qcp = tl.load(cp_ptr + rows, mask=inside, other=-1)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        count = tl.load(num_ptr + qt)
        for i in range(0, count):
            kt = tl.load(idx_ptr + qt * width + i)
            full = tl.load(full_ptr + qt * width + i)
            cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
            k = tl.load(k_ptr + hk * skh + cols[None, :] * skn + dims[:, None] * skd, mask=cols[None, :] < n, other=0.0)
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # log2 domain
            if full == 0:
                ok = _visible(qseg, qblk, qcp, rows, kseg_ptr, blk_ptr, cp_ptr, cols, n)
                s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: p = 0, not NaN
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + hk * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cols[:, None] < n, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        seen = l_i > 0
        out = acc / tl.where(seen, l_i, 1.0)[:, None]
        tl.store(o_ptr + h * soh + rows[:, None] * som + dims[None, :] * sod, out.to(o_ptr.dtype.element_ty),
                 mask=inside[:, None])
        # log2-sum-exp; +inf where a query sees no key, so its backward probabilities are 0
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
        tl.store(lse_ptr + h * n + rows, lse, mask=inside)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _probs(q, k, lse, rows, cols, full, qseg, qblk, qcp, kseg_ptr, blk_ptr, cp_ptr, qk_scale, n,  # type: ignore[no-untyped-def]
               PRECISION: tl.constexpr):
        """p [M, N] = softmax probabilities of the pairs (0 on invisible ones), recomputed."""
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        p = tl.exp2(s - lse[:, None])
        if full == 0:
            ok = _visible(qseg, qblk, qcp, rows, kseg_ptr, blk_ptr, cp_ptr, cols, n)
            p = tl.where(ok, p, 0.0)
        return p

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _bwd_dkdv_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, qseg_ptr, kseg_ptr, blk_ptr, cp_ptr,
        num_ptr, idx_ptr, full_ptr, order_ptr, qk_scale, sm_scale, n, n_rep, width,
        sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod, sdkh, sdkn, sdkd, sdvh, sdvn, sdvd,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        kt = tl.load(order_ptr + tl.program_id(1))
        hk = tl.program_id(0).to(tl.int64)
        cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        cin = cols < n
        k = tl.load(k_ptr + hk * skh + cols[:, None] * skn + dims[None, :] * skd, mask=cin[:, None], other=0.0)
        v = tl.load(v_ptr + hk * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cin[:, None], other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        count = tl.load(num_ptr + kt)
        for r in range(0, n_rep):
            h = hk * n_rep + r
            for i in range(0, count):
                qt = tl.load(idx_ptr + kt * width + i)
                full = tl.load(full_ptr + kt * width + i)
                rows = qt * BLOCK_M + tl.arange(0, BLOCK_M)
                inside = rows < n
                q = tl.load(q_ptr + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=inside[:, None], other=0.0)
                do = tl.load(do_ptr + h * sdoh + rows[:, None] * sdom + dims[None, :] * sdod, mask=inside[:, None],
                             other=0.0)
                lse = tl.load(lse_ptr + h * n + rows, mask=inside, other=float("inf"))
                delta = tl.load(delta_ptr + h * n + rows, mask=inside, other=0.0)
                qseg = tl.load(qseg_ptr + rows, mask=inside, other=-3)
                qblk = tl.load(blk_ptr + rows, mask=inside, other=0)
                qcp = tl.load(cp_ptr + rows, mask=inside, other=-1)
                p = _probs(q, k, lse, rows, cols, full, qseg, qblk, qcp, kseg_ptr, blk_ptr, cp_ptr, qk_scale, n,
                           PRECISION)
                dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
                dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        tl.store(dk_ptr + hk * sdkh + cols[:, None] * sdkn + dims[None, :] * sdkd,
                 (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=cin[:, None])
        tl.store(dv_ptr + hk * sdvh + cols[:, None] * sdvn + dims[None, :] * sdvd, dv.to(dv_ptr.dtype.element_ty),
                 mask=cin[:, None])

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _bwd_dq_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, qseg_ptr, kseg_ptr, blk_ptr, cp_ptr,
        num_ptr, idx_ptr, full_ptr, order_ptr, qk_scale, sm_scale, n, n_rep, width,
        sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod, sdqh, sdqm, sdqd,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        qt = tl.load(order_ptr + tl.program_id(1))
        h = tl.program_id(0).to(tl.int64)
        hk = h // n_rep
        rows = qt * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        inside = rows < n
        q = tl.load(q_ptr + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=inside[:, None], other=0.0)
        do = tl.load(do_ptr + h * sdoh + rows[:, None] * sdom + dims[None, :] * sdod, mask=inside[:, None], other=0.0)
        lse = tl.load(lse_ptr + h * n + rows, mask=inside, other=float("inf"))
        delta = tl.load(delta_ptr + h * n + rows, mask=inside, other=0.0)
        qseg = tl.load(qseg_ptr + rows, mask=inside, other=-3)
        qblk = tl.load(blk_ptr + rows, mask=inside, other=0)
        qcp = tl.load(cp_ptr + rows, mask=inside, other=-1)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        count = tl.load(num_ptr + qt)
        for i in range(0, count):
            kt = tl.load(idx_ptr + qt * width + i)
            full = tl.load(full_ptr + qt * width + i)
            cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
            cin = cols < n
            k = tl.load(k_ptr + hk * skh + cols[:, None] * skn + dims[None, :] * skd, mask=cin[:, None], other=0.0)
            v = tl.load(v_ptr + hk * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cin[:, None], other=0.0)
            p = _probs(q, k, lse, rows, cols, full, qseg, qblk, qcp, kseg_ptr, blk_ptr, cp_ptr, qk_scale, n, PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.store(dq_ptr + h * sdqh + rows[:, None] * sdqm + dims[None, :] * sdqd,
                 (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=inside[:, None])


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class Tile:
    """One kernel's tile: queries (BLOCK_M) and keys (BLOCK_N) per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"Tile.{name}={size}: tensor-core tiles need a power of two >= 16 (e.g. 64)")
        if self.warps not in (1, 2, 4, 8, 16) or self.stages < 1:
            raise ValueError(f"Tile(warps={self.warps}, stages={self.stages}): warps a power of two <= 16, "
                             "stages >= 1")


@dataclass(frozen=True)
class Tiling:
    """The tiles of the three kernels (each walks its own `Schedule`)."""

    forward: Tile
    dkdv: Tile
    dq: Tile

    def tiles(self) -> tuple[Tile, Tile, Tile]:
        """(forward, dkdv, dq)."""
        return self.forward, self.dkdv, self.dq


# FlashAttention-2's Triton tile shapes for head dim 128 (the forward 128 x 64; dK/dV a key tile of
# 128 walking 32 queries at a time; dQ 128 queries walking 32 keys), 8 warps each: compiled for
# sm_90 (tests/dllm_models/test_bd3lm_attention.py) ptxas reports no register spills in the forward
# and dQ and 28 bytes in dK/dV (4 warps: 2.9 KB); other shapes spilled more. Not yet timed on a GPU.
GPU_TILING = Tiling(forward=Tile(128, 64, 8, 3), dkdv=Tile(32, 128, 8, 3), dq=Tile(128, 32, 8, 3))
# small tiles for the CPU interpreter: a row of a few dozen positions spans several of each
INTERPRETER_TILING = Tiling(forward=Tile(16, 16), dkdv=Tile(16, 32), dq=Tile(32, 16))


def _launch_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds, sched: Schedule,
                    tile: Tile) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [Hq, N, D] as a view of [N, Hq, D] memory, lse float32 [Hq, N] in log2 units)."""
    hq, n, d = q.shape
    out = torch.empty((n, hq, d), dtype=q.dtype, device=q.device).transpose(0, 1)
    lse = torch.empty((hq, n), dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    _fwd_kernel[(hq, sched.q_num.numel())](
        q, k, v, out, lse, ids.qseg, ids.kseg, ids.blk, ids.copy, sched.q_num, sched.q_idx, sched.q_full,
        sched.q_order, sm_scale * LOG2E, n, hq // k.shape[0], sched.q_idx.shape[1], *q.stride(), *k.stride(), *v.stride(),
        *out.stride(), PRECISION=_precision(q.dtype), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_D=d,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    return out, lse


def _launch_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                     grad: torch.Tensor, ids: PositionIds, scheds: tuple[Schedule, Schedule], tiling: Tiling,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the forward `out`, `lse` for the output gradient `grad` [Hq, N, D]."""
    hq, n, d = q.shape
    hkv = k.shape[0]
    delta = (grad.float() * out.float()).sum(-1).contiguous()  # [Hq, N]: rowsum(dO * O)
    dq = torch.empty((n, hq, d), dtype=q.dtype, device=q.device).transpose(0, 1)
    dk = torch.empty((n, hkv, d), dtype=k.dtype, device=k.device).transpose(0, 1)
    dv = torch.empty((n, hkv, d), dtype=v.dtype, device=v.device).transpose(0, 1)
    sm_scale = 1.0 / math.sqrt(d)
    prec = _precision(q.dtype)
    s_kv, s_q = scheds
    t = tiling.dkdv
    _bwd_dkdv_kernel[(hkv, s_kv.k_num.numel())](
        q, k, v, grad, lse, delta, dk, dv, ids.qseg, ids.kseg, ids.blk, ids.copy,
        s_kv.k_num, s_kv.k_idx, s_kv.k_full, s_kv.k_order, sm_scale * LOG2E, sm_scale, n, hq // hkv, s_kv.k_idx.shape[1],
        *q.stride(), *k.stride(), *v.stride(), *grad.stride(), *dk.stride(), *dv.stride(),
        PRECISION=prec, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_D=d, num_warps=t.warps, num_stages=t.stages,
    )
    t = tiling.dq
    _bwd_dq_kernel[(hq, s_q.q_num.numel())](
        q, k, v, grad, lse, delta, dq, ids.qseg, ids.kseg, ids.blk, ids.copy,
        s_q.q_num, s_q.q_idx, s_q.q_full, s_q.q_order, sm_scale * LOG2E, sm_scale, n, hq // hkv, s_q.q_idx.shape[1],
        *q.stride(), *k.stride(), *v.stride(), *grad.stride(), *dq.stride(),
        PRECISION=prec, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_D=d, num_warps=t.warps, num_stages=t.stages,
    )
    return dq, dk, dv


class _BD3LMAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds,
                scheds: tuple[Schedule, Schedule, Schedule], tiling: Tiling) -> torch.Tensor:
        out, lse = _launch_forward(q, k, v, ids, scheds[0], tiling.forward)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ids, ctx.scheds, ctx.tiling = ids, scheds, tiling
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _launch_backward(q, k, v, out, lse, grad, ctx.ids, ctx.scheds[1:], ctx.tiling)
        return dq, dk, dv, None, None, None


def schedules(ids: PositionIds, tiling: Tiling, *, padded_keys: bool) -> tuple[Schedule, Schedule, Schedule]:
    """The forward's, dK/dV's and dQ's schedules of a row (`bd3lm_schedule.build_schedule` per tile)."""
    f, kv, q = (build_schedule(ids, t.block_m, t.block_n, padded_keys=padded_keys) for t in tiling.tiles())
    return f, kv, q


def bd3lm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds,
                    scheds: tuple[Schedule, Schedule, Schedule], tiling: Tiling) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the BD3LM-visible keys of one packed row, differentiable.

    Args:
        q: [Hq, N, D] queries (any strides; Hq a multiple of Hkv; D a power of two >= 16).
        k, v: [Hkv, N, D].
        ids: `bd3lm_schedule.position_ids` of the row's mask.
        scheds: `schedules(ids, tiling, ...)`.
        tiling: the kernels' tiles.

    Returns:
        [Hq, N, D] in q's dtype (a transposed view of [N, Hq, D] memory); a query that sees no
        key gets zeros.
    """
    out: torch.Tensor = _BD3LMAttention.apply(q, k, v, ids, scheds, tiling)
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
                 tiling: Tiling | None = None) -> torch.Tensor:
    """`bd3lm_attention` of q [1, Hq, N, D] over k, v [1, Hkv, N, D] under `mask` (see `bd3lm_fits`).

    The position ids and the three schedules are built once per mask and tiling (memoised on
    `mask.cache`, shared by every layer and by checkpoint recomputation). `tiling` None:
    `GPU_TILING` on CUDA, `INTERPRETER_TILING` on the CPU.
    """
    n = q.shape[2]
    if tiling is None:
        tiling = GPU_TILING if q.is_cuda else INTERPRETER_TILING
    key = ("bd3lm_kernel", n, tiling, str(q.device))
    if key not in mask.cache:
        ids = position_ids(mask, n, q.device)
        mask.cache[key] = (ids, schedules(ids, tiling, padded_keys=mask.key_padding is not None))
    ids, scheds = mask.cache[key]
    return bd3lm_attention(q[0], k[0], v[0], ids, scheds, tiling)[None]


__all__ = ["GPU_TILING", "INTERPRETER_TILING", "Tile", "Tiling", "bd3lm_attend", "bd3lm_attention", "bd3lm_fits",
           "schedules"]

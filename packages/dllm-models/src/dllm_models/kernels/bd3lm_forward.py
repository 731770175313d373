"""The BD3LM kernel's forward: FlashAttention's online softmax over a query tile's scheduled key tiles.

One program per (query head, query tile) keeps the running max and sum in float32 (Dao, arXiv
2307.08691) over the key tiles `bd3lm_schedule` lists for the query tile, masks element-wise only
on partial tiles (`_visible`, also used by the backward), and stores the output and the
log2-sum-exp the backward recomputes probabilities from. Set TRITON_INTERPRET=1 before importing
to run on CPU (tests).
"""

from __future__ import annotations

import math

import torch

from dllm_models.kernels.bd3lm_options import Tile
from dllm_models.kernels.bd3lm_schedule import PositionIds, Schedule
from dllm_models.kernels.logsumexp import HAS_TRITON

LOG2E = 1.4426950408889634

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _seen(qseg, qblk, qcp, q_in, kseg, kblk, kcp):  # type: ignore[no-untyped-def]
        """bool: a key (ids kseg, kblk, kcp) is visible to a query (qseg, qblk, qcp; q_in: inside the
        row), the ids broadcast against each other ([M, 1] with [1, N], or [1, M] with [N, 1])."""
        q_clean = (qcp == 0).to(tl.int32)
        clean_key = (kcp == 0) & (kblk < qblk + q_clean)
        own_block = (kcp == qcp) & (qcp != 0) & (kblk == qblk)
        return (kseg == qseg) & q_in & (clean_key | own_block)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _key_ids(kseg_ptr, blk_ptr, cp_ptr, cols, n):  # type: ignore[no-untyped-def]
        """(segment, block, copy) of keys `cols`; a key past the row has a segment no query has."""
        inside = cols < n
        kseg = tl.load(kseg_ptr + cols, mask=inside, other=-2)
        kblk = tl.load(blk_ptr + cols, mask=inside, other=0)
        kcp = tl.load(cp_ptr + cols, mask=inside, other=-1)
        return kseg, kblk, kcp

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _visible(qseg, qblk, qcp, rows, kseg_ptr, blk_ptr, cp_ptr, cols, n):  # type: ignore[no-untyped-def]
        """bool [M, N]: key `cols` is visible to query `rows` (`bd3lm_schedule.visible_reference`)."""
        kseg, kblk, kcp = _key_ids(kseg_ptr, blk_ptr, cp_ptr, cols, n)
        return _seen(qseg[:, None], qblk[:, None], qcp[:, None], (rows < n)[:, None], kseg[None, :], kblk[None, :],
                     kcp[None, :])

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


def precision(dtype: torch.dtype) -> str:
    """The tensor-core input precision of `tl.dot` for `dtype` (float32 inputs exact: 'ieee')."""
    return "ieee" if dtype == torch.float32 else "tf32"


def launch_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: PositionIds, sched: Schedule,
                   tile: Tile) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [Hq, N, D] as a view of [N, Hq, D] memory, lse float32 [Hq, N] in log2 units)."""
    hq, n, d = q.shape
    out = torch.empty((n, hq, d), dtype=q.dtype, device=q.device).transpose(0, 1)
    lse = torch.empty((hq, n), dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    _fwd_kernel[(hq, sched.q_num.numel())](
        q, k, v, out, lse, ids.qseg, ids.kseg, ids.blk, ids.copy, sched.q_num, sched.q_idx, sched.q_full,
        sched.q_order, sm_scale * LOG2E, n, hq // k.shape[0], sched.q_idx.shape[1], *q.stride(), *k.stride(),
        *v.stride(), *out.stride(), PRECISION=precision(q.dtype), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_D=d, num_warps=tile.warps, num_stages=tile.stages,
    )
    return out, lse


__all__ = ["LOG2E", "launch_forward", "precision"]

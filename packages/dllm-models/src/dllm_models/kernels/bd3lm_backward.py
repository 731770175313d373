"""The BD3LM kernel's backward: dK/dV programs over pieces of a key tile's query walk, dQ programs.

FlashAttention's backward (Dao, arXiv 2307.08691, Algorithm 2) over the tiles of `bd3lm_schedule`:
probabilities are recomputed from the forward's log2-sum-exp, delta = rowsum(dO * O) comes from a
small pre-pass kernel. A dK/dV program holds one key tile of one KV head and walks a run of the
query tiles that see it (`dkdv_items`: the whole list, or pieces of at most `dkdv_chunk`), for
each query head of the group (K, V and the key ids loaded once); its matmuls are written
transposed (keys as rows, as in Triton's fused-attention tutorial) so the key tile is the M of
every dot. A dQ program holds one (query head, query tile) and walks its key tiles. The variants of
`bd3lm_options` choose whether the programs run in one or two launches, whether dK/dV pieces are
summed by float32 atomics, and whether dQ is added by the dK/dV programs (FlashAttention-3) instead.
A dK/dV program walks its query tiles once per grouped head (the head loop outside, so the
pipelined inner loop is the long one).
"""

from __future__ import annotations

import math

import torch

from dllm_models.kernels.bd3lm_forward import LOG2E, precision
from dllm_models.kernels.bd3lm_options import BD3LMKernelOptions, Tiling
from dllm_models.kernels.bd3lm_schedule import PositionIds, Schedule
from dllm_models.kernels.logsumexp import HAS_TRITON

if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    from dllm_models.kernels.bd3lm_forward import _key_ids, _seen, _visible

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _delta_kernel(o_ptr, do_ptr, delta_ptr, n, soh, som, sod, sdoh, sdom, sdod,  # type: ignore[no-untyped-def]
                      BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
        """delta [Hq, N] float32 = rowsum(dO * O) (FlashAttention-2's backward pre-pass)."""
        h = tl.program_id(0).to(tl.int64)
        rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        dims = tl.arange(0, BLOCK_D)
        inside = rows < n
        o = tl.load(o_ptr + h * soh + rows[:, None] * som + dims[None, :] * sod, mask=inside[:, None], other=0.0)
        do = tl.load(do_ptr + h * sdoh + rows[:, None] * sdom + dims[None, :] * sdod, mask=inside[:, None],
                     other=0.0)
        tl.store(delta_ptr + h * n + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1), mask=inside)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _dkdv_program(  # type: ignore[no-untyped-def]
        pid, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, qseg_ptr, kseg_ptr, blk_ptr,
        cp_ptr, idx_ptr, full_ptr, item_ptr, qk_scale, sm_scale, n, n_rep, n_kv, width,
        sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod, sdqh, sdqm, sdqd,
        sdkh, sdkn, sdkd, sdvh, sdvn, sdvd,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        ATOMIC: tl.constexpr, FUSED: tl.constexpr,
    ):
        """dK, dV of one key tile of one KV head over query tiles [first, first + count) of its list."""
        item = pid // n_kv
        hk = (pid % n_kv).to(tl.int64)
        kt = tl.load(item_ptr + 3 * item)
        first = tl.load(item_ptr + 3 * item + 1)
        count = tl.load(item_ptr + 3 * item + 2)
        cols = kt * BLOCK_N + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        cin = cols < n
        k = tl.load(k_ptr + hk * skh + cols[:, None] * skn + dims[None, :] * skd, mask=cin[:, None], other=0.0)
        v = tl.load(v_ptr + hk * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cin[:, None], other=0.0)
        kseg, kblk, kcp = _key_ids(kseg_ptr, blk_ptr, cp_ptr, cols, n)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for r in range(0, n_rep):
            h = hk * n_rep + r
            for i in range(first, first + count):
                qt = tl.load(idx_ptr + kt * width + i)
                full = tl.load(full_ptr + kt * width + i)
                rows = qt * BLOCK_M + tl.arange(0, BLOCK_M)
                inside = rows < n
                q_t = tl.load(q_ptr + h * sqh + rows[None, :] * sqm + dims[:, None] * sqd, mask=inside[None, :],
                              other=0.0)  # [D, M]
                do = tl.load(do_ptr + h * sdoh + rows[:, None] * sdom + dims[None, :] * sdod, mask=inside[:, None],
                             other=0.0)
                lse = tl.load(lse_ptr + h * n + rows, mask=inside, other=float("inf"))
                delta = tl.load(delta_ptr + h * n + rows, mask=inside, other=0.0)
                p_t = tl.exp2(tl.dot(k, q_t, input_precision=PRECISION) * qk_scale - lse[None, :])
                if full == 0:  # keys as rows: [N, M]
                    qseg = tl.load(qseg_ptr + rows, mask=inside, other=-3)
                    qblk = tl.load(blk_ptr + rows, mask=inside, other=0)
                    qcp = tl.load(cp_ptr + rows, mask=inside, other=-1)
                    ok = _seen(qseg[None, :], qblk[None, :], qcp[None, :], inside[None, :], kseg[:, None],
                               kblk[:, None], kcp[:, None])
                    p_t = tl.where(ok, p_t, 0.0)
                dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
                dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
                ds_t = p_t * (dp_t - delta[None, :])
                dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=PRECISION)
                if FUSED:
                    dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=PRECISION) * sm_scale
                    tl.atomic_add(dq_ptr + h * sdqh + rows[:, None] * sdqm + dims[None, :] * sdqd, dq,
                                  mask=inside[:, None], sem="relaxed")
        dk_at = dk_ptr + hk * sdkh + cols[:, None] * sdkn + dims[None, :] * sdkd
        dv_at = dv_ptr + hk * sdvh + cols[:, None] * sdvn + dims[None, :] * sdvd
        if ATOMIC:
            # a sum of pieces: no ordering needed (the launch's end makes them visible)
            tl.atomic_add(dk_at, dk * sm_scale, mask=cin[:, None], sem="relaxed")
            tl.atomic_add(dv_at, dv, mask=cin[:, None], sem="relaxed")
        else:
            tl.store(dk_at, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=cin[:, None])
            tl.store(dv_at, dv.to(dv_ptr.dtype.element_ty), mask=cin[:, None])

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _dq_program(  # type: ignore[no-untyped-def]
        pid, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, qseg_ptr, kseg_ptr, blk_ptr, cp_ptr,
        num_ptr, idx_ptr, full_ptr, order_ptr, qk_scale, sm_scale, n, n_rep, n_q, width,
        sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod, sdqh, sdqm, sdqd,
        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """dQ of one (query head, query tile): program `pid` serves tile order[pid // Hq], head pid % Hq."""
        qt = tl.load(order_ptr + pid // n_q)
        h = (pid % n_q).to(tl.int64)
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
            p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
            if full == 0:
                p = tl.where(_visible(qseg, qblk, qcp, rows, kseg_ptr, blk_ptr, cp_ptr, cols, n), p, 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        tl.store(dq_ptr + h * sdqh + rows[:, None] * sdqm + dims[None, :] * sdqd,
                 (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=inside[:, None])

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _bwd_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, qseg_ptr, kseg_ptr, blk_ptr, cp_ptr,
        k_idx_ptr, k_full_ptr, item_ptr, q_num_ptr, q_idx_ptr, q_full_ptr, q_order_ptr,
        qk_scale, sm_scale, n, n_rep, n_kv, n_q, k_width, q_width, kv_programs,
        sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod, sdqh, sdqm, sdqd,
        sdkh, sdkn, sdkd, sdvh, sdvn, sdvd,
        PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
        BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, DO_KV: tl.constexpr, DO_Q: tl.constexpr,
        ATOMIC: tl.constexpr, FUSED: tl.constexpr,
    ):
        """Programs [0, kv_programs) are dK/dV pieces (when DO_KV), the rest dQ programs (when DO_Q)."""
        pid = tl.program_id(0)
        if pid < kv_programs:
            if DO_KV:
                _dkdv_program(pid, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, qseg_ptr,
                              kseg_ptr, blk_ptr, cp_ptr, k_idx_ptr, k_full_ptr, item_ptr, qk_scale, sm_scale, n,
                              n_rep, n_kv, k_width, sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom, sdod,
                              sdqh, sdqm, sdqd, sdkh, sdkn, sdkd, sdvh, sdvn, sdvd, PRECISION, BLOCK_M1, BLOCK_N1,
                              BLOCK_D, ATOMIC, FUSED)
        else:
            if DO_Q:
                _dq_program(pid - kv_programs, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, qseg_ptr,
                            kseg_ptr, blk_ptr, cp_ptr, q_num_ptr, q_idx_ptr, q_full_ptr, q_order_ptr, qk_scale,
                            sm_scale, n, n_rep, n_q, q_width, sqh, sqm, sqd, skh, skn, skd, svh, svn, svd, sdoh, sdom,
                            sdod, sdqh, sdqm, sdqd, PRECISION, BLOCK_M2, BLOCK_N2, BLOCK_D)


def dkdv_items(sched: Schedule, chunk: int | None) -> torch.Tensor:
    """int32 [I, 3] (key tile, first, count): the dK/dV programs' pieces of the key tiles' query walks.

    Args:
        sched: the dK/dV schedule (its per-key-tile lists `k_num`, `k_idx`).
        chunk: query tiles per piece; None = one piece per key tile with its whole list (unseen
            key tiles included, so the program stores their zero gradient).

    Returns:
        The pieces, longest first (each key tile's pieces in list order).
    """
    num = sched.k_num.long()
    if chunk is None:
        order = sched.k_order.long()
        return torch.stack([order, torch.zeros_like(order), num[order]], 1).to(torch.int32).contiguous()
    pieces = -(-num // chunk)
    tile = torch.repeat_interleave(torch.arange(num.numel(), device=num.device), pieces)
    start = torch.cumsum(pieces, 0) - pieces
    first = (torch.arange(tile.numel(), device=num.device) - start[tile]) * chunk
    count = torch.minimum(num[tile] - first, torch.full_like(first, chunk))
    order = torch.argsort(count, descending=True, stable=True)
    return torch.stack([tile[order], first[order], count[order]], 1).to(torch.int32).contiguous()


def _delta(out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """float32 [Hq, N] rowsum(dO * O)."""
    hq, n, d = out.shape
    delta = torch.empty((hq, n), dtype=torch.float32, device=out.device)
    block = 64
    _delta_kernel[(hq, triton.cdiv(n, block))](out, grad, delta, n, *out.stride(), *grad.stride(), BLOCK=block,
                                               BLOCK_D=d)
    return delta


def launch_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    grad: torch.Tensor, ids: PositionIds, scheds: tuple[Schedule, Schedule], items: torch.Tensor,
                    options: BD3LMKernelOptions, tiling: Tiling) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the forward `out`, `lse` for the output gradient `grad` [Hq, N, D].

    Args:
        scheds: the dK/dV and dQ schedules (`schedules(...)[1:]`).
        items: `dkdv_items(scheds[0], chunk)` for these options.
    """
    hq, n, d = q.shape
    hkv = k.shape[0]
    delta = _delta(out, grad)
    atomic = options.chunked
    fused = options.backward == "fused"
    if atomic:
        dk = torch.zeros((hkv, n, d), dtype=torch.float32, device=k.device)
        dv = torch.zeros((hkv, n, d), dtype=torch.float32, device=v.device)
    else:
        dk = torch.empty((n, hkv, d), dtype=k.dtype, device=k.device).transpose(0, 1)
        dv = torch.empty((n, hkv, d), dtype=v.dtype, device=v.device).transpose(0, 1)
    dq = (torch.zeros((hq, n, d), dtype=torch.float32, device=q.device) if fused
          else torch.empty((n, hq, d), dtype=q.dtype, device=q.device).transpose(0, 1))
    s_kv, s_q = scheds
    kv_programs = items.shape[0] * hkv
    q_programs = 0 if fused else hq * s_q.q_num.numel()
    sm_scale = 1.0 / math.sqrt(d)
    t_kv, t_q = tiling.dkdv, tiling.dq

    def launch(grid: int, do_kv: bool, do_q: bool, warps: int, stages: int) -> None:
        if grid == 0:
            return
        _bwd_kernel[(grid,)](
            q, k, v, grad, lse, delta, dq, dk, dv, ids.qseg, ids.kseg, ids.blk, ids.copy,
            s_kv.k_idx, s_kv.k_full, items, s_q.q_num, s_q.q_idx, s_q.q_full, s_q.q_order,
            sm_scale * LOG2E, sm_scale, n, hq // hkv, hkv, hq, s_kv.k_idx.shape[1], s_q.q_idx.shape[1],
            kv_programs if do_kv else 0, *q.stride(), *k.stride(), *v.stride(), *grad.stride(), *dq.stride(),
            *dk.stride(), *dv.stride(), PRECISION=precision(q.dtype), BLOCK_D=d, BLOCK_M1=t_kv.block_m,
            BLOCK_N1=t_kv.block_n, BLOCK_M2=t_q.block_m, BLOCK_N2=t_q.block_n, DO_KV=do_kv, DO_Q=do_q,
            ATOMIC=atomic, FUSED=fused, num_warps=warps, num_stages=stages,
        )

    if options.backward == "split":
        launch(kv_programs, True, False, t_kv.warps, t_kv.stages)
        launch(q_programs, False, True, t_q.warps, t_q.stages)
    else:
        launch(kv_programs + q_programs, True, not fused, t_kv.warps, t_kv.stages)
    if atomic:
        dk, dv = dk.to(k.dtype), dv.to(v.dtype)
    if fused:
        dq = dq.to(q.dtype)
    return dq, dk, dv


__all__ = ["dkdv_items", "launch_backward"]

"""Attention of a few queries per row against a wide, partly visible KV cache (a decoding step).

A cached block-diffusion step attends with Lq = block_length queries per row (and n_rep query heads
per KV head: M = n_rep * Lq rows per program, read through their strides) over a cache that spans the whole
canvas, of which only some columns are visible (`key_padding`: left padding and the blocks not yet
decoded are hidden). A dense-mask attention kernel reads every column of the cache at every step.
This kernel computes the same function (softmax(q k^T / sqrt(D)) v over the visible keys) with one
program per (row, KV head): it walks the columns in tiles of BLOCK_N, skips every tile with no
visible column without loading its keys or values, and keeps the softmax online in float32
(FlashAttention's recurrence, Dao et al. 2022, arXiv 2205.14135), so a step reads only the keys
it uses. A call may also give each query a key limit (`key_limit`: query i sees columns < limit[i]),
which keeps a call over two blocks (a finished block and the next one) block-causal. With `splits` > 1
each (row, KV head) is served by several programs over contiguous column ranges, whose partial
softmax states a second kernel merges (flash-decoding): more parallelism for few rows or long
caches (`splits`; `KernelConfig.decode_splits`, default 1). With `span` (each row's first and last visible
column, `visible_span`) a program walks only the tiles of that range, with masked loads and no
branch per tile, so the compiler can pipeline the tiles' loads (the default of
`dllm_models.attention`: 5 % faster decoding of SDAR-8B on the H200; `KernelConfig.decode_span=False`
restores the skip branch). The tuning knobs are arguments (`KernelConfig.decode_*` in a model). Set TRITON_INTERPRET=1 before importing to run it on CPU (tests).
"""

from __future__ import annotations

import math

import torch

from dllm_models.kernels.logsumexp import HAS_TRITON, runs_on


if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _tile(  # type: ignore[no-untyped-def]
        q, k_base, v_base, cols, seen, limit, m_i, l_i, acc, sm_scale, dims, skn, skd, svn, svd,
        HAS_LIM: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """One tile of columns `cols` (visible where `seen`) into the online softmax state."""
        k = tl.load(k_base + cols[None, :] * skn + dims[:, None] * skd, mask=seen[None, :], other=0.0)
        s = tl.dot(q, k, input_precision=PRECISION) * sm_scale
        if HAS_LIM:
            s = tl.where(seen[None, :] & (cols[None, :] < limit[:, None]), s, float("-inf"))
        else:
            s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # a row that has seen no key yet keeps m = -inf: shift by 0 there, so p = 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * svn + dims[None, :] * svd, mask=seen[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i, acc

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _store(o_ptr, acc, l_i, b, h, rows, dims, m_rows, q_len, n_rep, sob, soh, som, sod):  # type: ignore[no-untyped-def]
        """out = acc / l (0 where a query saw no key), written through the output's strides: row
        r * q_len + i of KV head h is query i of query head h * n_rep + r."""
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_off = (h * n_rep + rows // q_len) * soh + (rows % q_len) * som
        tl.store(o_ptr + b * sob + o_off[:, None] + dims[None, :] * sod,
                 out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < m_rows)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _decode_attention_kernel(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, pad_ptr, lim_ptr, span_ptr, o_ptr, ws_ptr, sm_scale, m_rows, n_cols, q_len, n_rep, part_cols,
        sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, spb, spn, sob, soh, som, sod,
        HAS_PAD: tl.constexpr, HAS_LIM: tl.constexpr, HAS_SPAN: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        part = tl.program_id(2).to(tl.int64)  # this program's columns: [part * part_cols, (part + 1) * part_cols)
        rows = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        cols0 = tl.arange(0, BLOCK_N)
        # row r * q_len + i of KV head h is query i of query head h * n_rep + r
        head = h * n_rep + rows // q_len
        q_off = head * sqh + (rows % q_len) * sqm
        q = tl.load(q_ptr + b * sqb + q_off[:, None] + dims[None, :] * sqd, mask=rows[:, None] < m_rows, other=0.0)
        if HAS_LIM:
            limit = tl.load(lim_ptr + rows % q_len, mask=rows < m_rows, other=0)
        else:
            limit = rows
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = k_ptr + b * skb + h * skh
        v_base = v_ptr + b * svb + h * svh
        lo = part * part_cols
        hi = tl.minimum(lo + part_cols, n_cols)
        if HAS_SPAN:  # this row's visible columns [first, last): the tiles outside are never walked
            first = tl.load(span_ptr + b * 2).to(tl.int64)
            last = tl.load(span_ptr + b * 2 + 1).to(tl.int64)
            lo = tl.maximum(lo, first - first % BLOCK_N)
            hi = tl.minimum(hi, last)
        for start in range(lo, hi, BLOCK_N):
            cols = start + cols0
            inside = cols < n_cols
            if HAS_PAD:
                seen = tl.load(pad_ptr + b * spb + cols * spn, mask=inside, other=0) != 0
            else:
                seen = inside
            if HAS_SPAN:  # no branch per tile: the loads can be pipelined
                m_i, l_i, acc = _tile(q, k_base, v_base, cols, seen, limit, m_i, l_i, acc, sm_scale, dims,
                                      skn, skd, svn, svd, HAS_LIM, PRECISION)
            elif tl.max(seen.to(tl.int32), axis=0) > 0:  # skip a tile with no visible column
                m_i, l_i, acc = _tile(q, k_base, v_base, cols, seen, limit, m_i, l_i, acc, sm_scale, dims,
                                      skn, skd, svn, svd, HAS_LIM, PRECISION)
        if SPLIT:  # the partial state (m, l, unnormalised acc), merged by _merge_kernel
            base = ((b * tl.num_programs(1) + h) * tl.num_programs(2) + part) * BLOCK_M
            tl.store(ws_ptr + (base + rows)[:, None] * (BLOCK_D + 2) + dims[None, :], acc)
            tl.store(ws_ptr + (base + rows) * (BLOCK_D + 2) + BLOCK_D, m_i)
            tl.store(ws_ptr + (base + rows) * (BLOCK_D + 2) + BLOCK_D + 1, l_i)
        else:
            _store(o_ptr, acc, l_i, b, h, rows, dims, m_rows, q_len, n_rep, sob, soh, som, sod)

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _merge_kernel(  # type: ignore[no-untyped-def]
        ws_ptr, o_ptr, m_rows, q_len, n_rep, parts, sob, soh, som, sod,
        BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        """out = the softmax of all column parts, from their partial states (the same recurrence)."""
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        rows = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for part in range(0, parts):
            base = ((b * tl.num_programs(1) + h) * parts + part) * BLOCK_M
            a_p = tl.load(ws_ptr + (base + rows)[:, None] * (BLOCK_D + 2) + dims[None, :])
            m_p = tl.load(ws_ptr + (base + rows) * (BLOCK_D + 2) + BLOCK_D)
            l_p = tl.load(ws_ptr + (base + rows) * (BLOCK_D + 2) + BLOCK_D + 1)
            m_new = tl.maximum(m_i, m_p)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_use)
            beta = tl.exp(m_p - m_use)
            l_i = l_i * alpha + l_p * beta
            acc = acc * alpha[:, None] + a_p * beta[:, None]
            m_i = m_new
        _store(o_ptr, acc, l_i, b, h, rows, dims, m_rows, q_len, n_rep, sob, soh, som, sod)


def decode_attention_fits(q: torch.Tensor, k: torch.Tensor, *, max_rows: int = 64) -> bool:
    """Whether `decode_attention` serves queries `q` [B, Hq, Lq, D] against `k` [B, Hkv, N, D].

    A few query rows per KV head (n_rep * Lq <= `max_rows`, at most 128), a power-of-two head size, enough (row, KV head)
    programs to fill the GPU, and a device the kernel runs on. `max_rows` 64 was measured on the H200;
    128 (blocks of 32 with 4 query heads per KV head: LLaDA2, SDAR b32) runs with 8 warps, not yet measured.
    """
    b, hq, lq, d = q.shape
    h = k.shape[1]
    return (runs_on(q) and hq % h == 0 and (hq // h) * lq <= min(max_rows, 128) and d in (32, 64, 128, 256) and k.shape[2] >= 16
            and (b * h >= 128 or not q.is_cuda) and q.dtype in (torch.bfloat16, torch.float16, torch.float32))


def visible_span(key_padding: torch.Tensor) -> torch.Tensor:
    """int32 [B, 2]: each row's first visible column and one past its last (0 and N where none is).

    Args:
        key_padding: bool [B, N], True on visible keys.
    """
    seen = key_padding.to(torch.int32)
    n = seen.shape[1]
    first = seen.argmax(1)  # the first maximal index: the first visible column (0 where none is)
    last = n - seen.flip(1).argmax(1)
    return torch.stack([first, last], dim=1).to(torch.int32)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     key_padding: torch.Tensor | None, key_limit: torch.Tensor | None = None, *,
                     splits: int = 1, span: torch.Tensor | None = None, block_n: int = 128,
                     stages: int = 2) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the visible keys, grouped query heads.

    The n_rep = Hq / Hkv query heads of a KV head and their Lq queries are one program's rows, read
    and written through their strides: no folded copy of the queries, and the result's memory is
    [B, Lq, Hq, D] (so `out.transpose(1, 2).reshape(B, Lq, Hq * D)` is a view).

    Args:
        q: [B, Hq, Lq, D] queries, any strides (Hq a multiple of Hkv); k, v: [B, Hkv, N, D].
        key_padding: bool [B, N], True on visible keys (None: all visible).
        key_limit: long [Lq]: query i sees only keys < key_limit[i], the same for every row and head
            (None: no limit).
        splits: programs per (row, KV head), each over a contiguous share of the columns, merged by
            a second kernel (flash-decoding: more programs for few rows or long caches; 1: one program).
        span: int32 [B, 2] `visible_span(key_padding[:, -N:])`: each row walks only the tiles of
            its visible range (every column outside it must be hidden); None: every tile, skipping
            those with no visible column.
        block_n: key columns per tile (64 at most for head size 256 or more than 64 query rows);
            stages: pipeline stages of the tile loop (tuning knobs, measured on the H200).

    Returns:
        [B, Hq, Lq, D] in q's dtype (a transposed view of a [B, Lq, Hq, D] tensor); a query with no
        visible key gets zeros.
    """
    b, hq, lq, d = q.shape
    h, n = k.shape[1], k.shape[2]
    n_rep = hq // h
    m = n_rep * lq
    out = torch.empty((b, lq, hq, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    if key_padding is not None:
        pad = key_padding[:, -n:]
        pad = pad.view(torch.uint8) if pad.dtype == torch.bool else pad.to(torch.uint8)
        strides = (pad.stride(0), pad.stride(1))
    else:
        pad, strides = q, (0, 0)
    if key_limit is not None:
        if key_limit.numel() != lq:
            raise ValueError(f"key_limit has {key_limit.numel()} entries for {lq} queries: give one per query")
        lim = key_limit.to(device=q.device, dtype=torch.int32).contiguous()
    else:
        lim = q
    if span is not None and (key_padding is None or span.shape != (b, 2) or span.dtype != torch.int32):
        raise ValueError(f"span must be visible_span(key_padding): int32 [{b}, 2] with a key_padding, "
                         f"got {tuple(span.shape)} {span.dtype}")
    block_m = max(16, 1 << (m - 1).bit_length())
    # shared memory: the query tile and two stages of K and V tiles
    block_n = block_n if d <= 128 and block_m <= 64 else min(block_n, 64)
    warps = 8 if block_m > 64 else 4
    tiles = -(-n // block_n)
    parts = max(1, min(splits, tiles))
    cols_per_part = -(-tiles // parts) * block_n  # whole tiles
    parts = -(-n // cols_per_part)
    ws = torch.empty((b, h, parts, block_m, d + 2), dtype=torch.float32, device=q.device) if parts > 1 else out
    bounds = span.contiguous() if span is not None else lim
    _decode_attention_kernel[(b, h, parts)](
        q, k, v, pad, lim, bounds, out, ws, 1.0 / math.sqrt(d), m, n, lq, n_rep, cols_per_part,
        *q.stride(), *k.stride(), *v.stride(), *strides, *out.stride(),
        HAS_PAD=key_padding is not None, HAS_LIM=key_limit is not None, HAS_SPAN=span is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=d,
        SPLIT=parts > 1, num_warps=warps, num_stages=stages,
    )
    if parts > 1:
        _merge_kernel[(b, h)](ws, out, m, lq, n_rep, parts, *out.stride(), BLOCK_M=block_m, BLOCK_D=d, num_warps=warps)
    return out

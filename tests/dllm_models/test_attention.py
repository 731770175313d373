"""Attention backends agree on every mask kind; the flex BlockMask is exact and sparse."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_models.attention import AttentionMask, attend, available_backends, bd3lm_mask

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _qkv(b: int, hq: int, hkv: int, lq: int, lk: int, d: int = 16, seed: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, d, generator=g)
    k = torch.randn(b, hkv, lk, d, generator=g)
    v = torch.randn(b, hkv, lk, d, generator=g)
    return tuple(x.to(**kw) for x in (q, k, v))  # type: ignore[arg-type]


def _cases() -> dict[str, tuple[AttentionMask, int, int, int]]:
    """name -> (mask, batch, Lq, Lk)."""
    g = torch.Generator().manual_seed(1)
    pad = torch.ones(3, 21, dtype=torch.bool)
    pad[0, :5] = False  # left padding
    pad[2, 15:] = False  # right padding
    cu = torch.tensor([0, 7, 9, 30], dtype=torch.int32)
    blocks = (torch.arange(24) // 4)[None].expand(2, -1)
    return {
        "none": (AttentionMask(), 2, 19, 19),
        "padding": (AttentionMask(key_padding=pad), 3, 21, 21),
        "packed": (AttentionMask(cu_seqlens=cu, max_seqlen=21), 1, 30, 30),
        "block_causal": (AttentionMask(block_ids=blocks), 2, 24, 24),
        "block_causal_padded_cache": (
            AttentionMask(key_padding=torch.rand(2, 24, generator=g) > 0.2, block_ids=blocks), 2, 8, 24
        ),
        "packed_block_causal": (
            AttentionMask(cu_seqlens=cu, block_ids=torch.cat([torch.arange(n) // 3 for n in (7, 2, 21)])[None]),
            1, 30, 30,
        ),
        "bd3lm": (bd3lm_mask([13, 4, 22], block_size=4), 1, 78, 78),
        # 3 + 1 + 2 noisy copies sharing each sample's clean copy: 13*4 + 4*2 + 22*3 = 126 positions
        "bd3lm_shared": (bd3lm_mask([13, 4, 22], block_size=4, copies=[3, 1, 2]), 1, 126, 126),
        # samples shorter than a block: one 4-position tile holds several copies of the same block
        "bd3lm_shared_short": (bd3lm_mask([2, 3], block_size=4, copies=[5, 4]), 1, 27, 27),
    }


@pytest.mark.parametrize("name", list(_cases()))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_backends_agree_on_cpu(name: str, heads: tuple[int, int]) -> None:
    mask, b, lq, lk = _cases()[name]
    q, k, v = _qkv(b, heads[0], heads[1], lq, lk)
    ref = attend(q, k, v, mask, backend="eager")
    for backend in ("sdpa", "flex"):
        out = attend(q, k, v, mask, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=f"{backend} on {name}")


def test_bd3lm_layout_by_hand() -> None:
    # one sample of length 4, block 2: positions x_t = 0..3, x_0 = 4..7, blocks 0,0,1,1 twice
    dense = bd3lm_mask([4], block_size=2).dense(8, 8, CPU)
    assert dense is not None
    expected = torch.tensor([
        # noisy block 0 sees noisy block 0 only (no clean block < 0)
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        # noisy block 1 sees noisy block 1 and clean block 0
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        # clean block 0 sees clean block 0; clean block 1 sees clean blocks 0 and 1
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(dense[0, 0], expected)


@pytest.mark.parametrize("name", list(_cases()))
def test_flex_tiles_are_exact_and_sparse(name: str) -> None:
    from dllm_models.flex import _positions, mask_mod_for, tile_classes

    mask, b, lq, lk = _cases()[name]
    tile = 4
    pos = _positions(mask, b, lk, math.ceil(lk / tile) * tile, CPU)
    any_, full = tile_classes(mask, pos, lq, lk, tile)
    exact = mask_mod_for(mask, pos, lk - lq)
    qi, ki = torch.arange(lq)[:, None], torch.arange(lk)[None]
    dense = mask.dense(lq, lk, CPU)
    for row in range(b):
        allowed = exact(torch.tensor(row), 0, qi, ki)
        want = torch.ones(lq, lk, dtype=torch.bool)
        if dense is not None:
            want = dense[min(row, dense.shape[0] - 1), 0].expand(lq, lk)
        assert torch.equal(allowed, want)
        tile_any, tile_full = any_[row][qi // tile, ki // tile], full[row][qi // tile, ki // tile]
        assert not (allowed & ~tile_any).any(), "an allowed pair sits in a skipped tile"
        assert not (tile_full & ~allowed).any(), "a full tile holds a masked pair"
    if name in ("bd3lm", "bd3lm_shared"):  # the layout is sparse: many tiles are skipped, many need no mask_mod
        assert (~any_).float().mean() > 0.4 and full.any()


def test_flex_bd3lm_matches_sdpa_on_random_shapes() -> None:
    """The sparse BlockMask + mask_mod of random BD3LM packs (tiles 16-128, key padding on top)
    equal the dense mask, through the CPU flex forward."""
    from dllm_models.flex import _eager_flex, build_block_mask

    g = torch.Generator().manual_seed(0)
    for i in range(12):
        n = int(torch.randint(1, 4, (), generator=g))
        lengths = torch.randint(1, 24, (n,), generator=g).tolist()
        block = [1, 2, 3, 4, 8, 32][i % 6]
        tile = [16, 32, 128][i % 3]
        mask = bd3lm_mask(lengths, block_size=block)
        total = 2 * sum(lengths)
        if i % 4 == 3:
            kp = torch.rand(1, total, generator=g) > 0.1
            mask = AttentionMask(key_padding=kp, block_ids=mask.block_ids, cu_seqlens=mask.cu_seqlens,
                                 max_seqlen=mask.max_seqlen, is_clean=mask.is_clean)
        q, k, v = _qkv(1, 4, 2, total, total, seed=i)
        ref = attend(q, k, v, mask, backend="eager")
        out = _eager_flex(q, k, v, build_block_mask(mask, 1, total, total, CPU, tile=tile), True)
        dense = mask.dense(total, total, CPU)
        assert dense is not None
        seen = dense.any(-1, keepdim=True)  # rows with no visible key: eager and flex give 0
        torch.testing.assert_close(out * seen, ref * seen, rtol=1e-5, atol=1e-5, msg=f"{lengths} {block} {tile}")
        torch.testing.assert_close(attend(q, k, v, mask, backend="flex"), ref, rtol=1e-5, atol=1e-5)


def test_shared_clean_layout_is_the_doubled_layout_per_copy() -> None:
    """Each noisy copy of [x_0 ; x_t^1 ; ... ; x_t^k] sees exactly what it sees in its own
    [x_t ; x_0] pair of the doubled layout (the shared clean copy standing in for the pair's),
    never another copy and never another sample; the clean copy sees what a pair's clean copy sees."""
    lengths, copies, block = [5, 3, 9], [3, 1, 2], 2
    shared = bd3lm_mask(lengths, block, copies=copies)
    n = sum((k + 1) * m for m, k in zip(lengths, copies))
    got = shared.dense(n, n, CPU)
    pairs = [m for m, k in zip(lengths, copies) for _ in range(k)]  # one doubled pair per copy
    d = 2 * sum(pairs)
    ref = bd3lm_mask(pairs, block).dense(d, d, CPU)  # checked by hand in test_bd3lm_layout_by_hand
    assert got is not None and ref is not None
    pair_start = [0] + torch.tensor([2 * m for m in pairs]).cumsum(0).tolist()
    # every shared position: (sample, pair of its copy or None for x_0, offset in the sample)
    where: list[tuple[int, int | None, int]] = []
    base = 0
    for s, (m, k) in enumerate(zip(lengths, copies)):
        where += [(s, None, i) for i in range(m)]
        where += [(s, base + c, i) for c in range(k) for i in range(m)]
        base += k

    def doubled(pos: tuple[int, int | None, int], pair: int) -> int:
        _, own, i = pos
        return pair_start[pair] + (i if own is not None else pairs[pair] + i)  # x_t first, then x_0

    first_pair = [sum(copies[:s]) for s in range(len(lengths))]
    for q in range(n):
        qs, qp, _ = where[q]
        pair = qp if qp is not None else first_pair[qs]
        for k in range(n):
            ks, kp, _ = where[k]
            if ks != qs or (kp is not None and kp != pair):
                want = False  # another sample, or a noisy key of another copy
            else:
                want = bool(ref[0, 0, doubled(where[q], pair), doubled(where[k], pair)])
            assert bool(got[0, 0, q, k]) == want, (q, k)
    assert shared.cu_seqlens is not None and shared.cu_seqlens.tolist() == [0, 20, 26, 53]


def test_shared_clean_layout_by_hand() -> None:
    # one sample of length 2, block 1, two noisy copies: x_0 = 0..1, x_t^1 = 2..3, x_t^2 = 4..5
    dense = bd3lm_mask([2], block_size=1, copies=[2]).dense(6, 6, CPU)
    assert dense is not None
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],  # clean block 0: itself
        [1, 1, 0, 0, 0, 0],  # clean block 1: clean blocks 0, 1
        [0, 0, 1, 0, 0, 0],  # copy 1 block 0: itself only
        [1, 0, 0, 1, 0, 0],  # copy 1 block 1: clean block 0 and itself
        [0, 0, 0, 0, 1, 0],  # copy 2 block 0: itself only (not copy 1's block 0)
        [1, 0, 0, 0, 0, 1],  # copy 2 block 1: clean block 0 and itself
    ], dtype=torch.bool)
    assert torch.equal(dense[0, 0], expected)


def test_flex_shared_clean_layout_matches_eager_on_random_shapes() -> None:
    """The sparse BlockMask of random shared-clean packs (copies 1-5, tiles 16-128) equals the dense mask."""
    from dllm_models.flex import _eager_flex, build_block_mask

    g = torch.Generator().manual_seed(1)
    for i in range(12):
        n = int(torch.randint(1, 4, (), generator=g))
        lengths = torch.randint(1, 24, (n,), generator=g).tolist()
        copies = torch.randint(1, 6, (n,), generator=g).tolist()
        block = [1, 2, 3, 4, 8, 32][i % 6]
        tile = [16, 32, 128][i % 3]
        mask = bd3lm_mask(lengths, block_size=block, copies=copies)
        total = sum((k + 1) * m for m, k in zip(lengths, copies))
        q, k, v = _qkv(1, 4, 2, total, total, seed=i)
        ref = attend(q, k, v, mask, backend="eager")
        out = _eager_flex(q, k, v, build_block_mask(mask, 1, total, total, CPU, tile=tile), True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=f"{lengths} {copies} {block} {tile}")


def test_positions_of_the_shared_clean_layout() -> None:
    from dllm_models.families.backbone import positions_from_attention

    mask = bd3lm_mask([3, 2], block_size=2, copies=[2, 1])
    pos = positions_from_attention(mask, 1, 13, CPU)
    assert pos[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 0, 1]


def test_flex_block_mask_is_built_once_per_mask() -> None:
    mask, b, lq, lk = _cases()["bd3lm"]
    q, k, v = _qkv(b, 2, 2, lq, lk)
    attend(q, k, v, mask, backend="flex")
    first = dict(mask.cache)
    attend(q, k, v, mask, backend="flex")
    assert [id(x) for x in mask.cache.values()] == [id(x) for x in first.values()]


def test_varlen_on_cpu_is_a_clear_error() -> None:
    q, k, v = _qkv(1, 2, 2, 8, 8)
    mask = AttentionMask(cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32), max_seqlen=5)
    with pytest.raises(RuntimeError, match="needs a CUDA device.*'sdpa' or 'flex'"):
        attend(q, k, v, mask, backend="varlen")
    assert "varlen" not in available_backends("cpu")
    with pytest.raises(ValueError, match="not available; choose one of"):
        attend(q, k, v, mask, backend="nope")


def test_bd3lm_mask_validates() -> None:
    with pytest.raises(ValueError, match="copies must give one positive count per sample"):
        bd3lm_mask([4, 2], block_size=2, copies=[1])
    with pytest.raises(ValueError, match="copies must give one positive count per sample"):
        bd3lm_mask([4], block_size=2, copies=[0])
    with pytest.raises(ValueError, match="copy_ids .* needs is_clean"):
        AttentionMask(block_ids=torch.zeros(1, 2, dtype=torch.long), copy_ids=torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        bd3lm_mask([4], block_size=0)
    with pytest.raises(ValueError, match="needs block_ids"):
        AttentionMask(is_clean=torch.ones(1, 4, dtype=torch.bool))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", ["none", "packed"])
def test_varlen_matches_sdpa_on_gpu(name: str) -> None:
    mask, b, lq, lk = _cases()[name]
    q, k, v = _qkv(b, 8, 2, lq, lk, d=64, device="cuda", dtype=torch.bfloat16)
    mask = AttentionMask(
        cu_seqlens=None if mask.cu_seqlens is None else mask.cu_seqlens.cuda(), max_seqlen=mask.max_seqlen
    )
    for x in (q, k, v):
        x.requires_grad_(True)
    ref = attend(q, k, v, mask, backend="sdpa")
    out = attend(q, k, v, mask, backend="varlen")
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    g_ref = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    g_out = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    for a, r in zip(g_out, g_ref):
        torch.testing.assert_close(a, r, rtol=5e-2, atol=5e-2)


def _to_cuda(mask: AttentionMask) -> AttentionMask:
    def mv(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.cuda()

    return AttentionMask(
        key_padding=mv(mask.key_padding), block_ids=mv(mask.block_ids), cu_seqlens=mv(mask.cu_seqlens),
        max_seqlen=mask.max_seqlen, is_clean=mv(mask.is_clean),
    )


def _rel_err(a: torch.Tensor, truth: torch.Tensor) -> float:
    return float((a.float() - truth).norm() / truth.norm().clamp_min(1e-6))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(_cases()))
def test_compiled_flex_matches_sdpa_on_gpu(name: str) -> None:
    mask, b, lq, lk = _cases()[name]
    mask = _to_cuda(mask)
    q, k, v = _qkv(b, 8, 2, lq, lk, d=64, device="cuda", dtype=torch.bfloat16)
    for x in (q, k, v):
        x.requires_grad_(True)
    ref = attend(q, k, v, mask, backend="sdpa")
    out = attend(q, k, v, mask, backend="flex")
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    g_ref = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    g_out = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    # Gradients: two bf16 kernels may each be off by ~half the old elementwise tolerance on the
    # BD3LM dK (its early clean keys collect ~160 query terms, |dK| up to ~25), so both are
    # measured against float32 math on the same bf16 inputs: flex must be as close as sdpa.
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    truth = attend(q32, k32, v32, mask, backend="eager")
    g_truth = torch.autograd.grad(truth.square().sum(), (q32, k32, v32))
    for what, a, r, t in zip("qkv", g_out, g_ref, g_truth):
        err_flex, err_sdpa = _rel_err(a, t), _rel_err(r, t)
        assert err_flex < max(2e-2, 2 * err_sdpa), f"d{what}: flex {err_flex:.2e}, sdpa {err_sdpa:.2e}"
        torch.testing.assert_close(a.float(), t, rtol=0.1, atol=0.25, msg=f"d{what} of flex vs float32")


@pytest.mark.gpu
@needs_cuda
def test_flex_bd3lm_at_real_length_on_gpu() -> None:
    # 8 samples, 2 x 512 tokens each, block 4: the sparse build never makes the 8192^2 mask
    mask = bd3lm_mask([512] * 8, block_size=4, device="cuda")
    q, k, v = _qkv(1, 8, 8, 8192, 8192, d=64, device="cuda", dtype=torch.bfloat16)
    out = attend(q, k, v, mask, backend="flex")
    ref = attend(q, k, v, mask, backend="sdpa")
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)


def test_attention_mask_survives_fsdp_input_casting() -> None:
    # FSDP2's MixedPrecisionPolicy casts forward inputs with torch.distributed.utils._apply_to_tensors,
    # which rebuilds dataclasses through dataclasses.replace: every field must be an init field
    from torch.distributed.utils import _apply_to_tensors

    mask = AttentionMask(key_padding=torch.ones(2, 5, dtype=torch.bool), block_ids=torch.zeros(2, 5, dtype=torch.long))
    mask.cache["k"] = 1
    cast = _apply_to_tensors(lambda t: t.clone(), mask)
    assert isinstance(cast, AttentionMask) and torch.equal(cast.block_ids, mask.block_ids)
    assert cast.cache == {"k": 1}


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_key_limit_is_per_query_visibility_in_every_backend(heads: tuple[int, int]) -> None:
    """`key_limit` (a forward over two blocks of an in-place cache): query i sees keys < limit[i] and
    the visible ones only; sdpa (plain and grouped), eager and flex compute that function."""
    from dllm_models.attention import BACKENDS, AttentionMask

    g = torch.Generator().manual_seed(5)
    hq, hkv = heads
    b, lq, lk, d = 3, 8, 40, 16
    q = torch.randn(b, hq, lq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64) for _ in range(2))
    pad = torch.rand(b, lk, generator=g) < 0.8
    pad[:, 24:32] = True
    limit = torch.tensor([28] * 4 + [32] * 4)
    mask = AttentionMask(key_padding=pad, key_limit=limit)
    kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scores = (q @ kk.transpose(-1, -2)) / d**0.5
    allowed = pad[:, None, None, :] & (torch.arange(lk)[None, :] < limit[:, None])[None, None]
    want = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ vv
    for name in ("sdpa", "eager", "flex"):
        got = BACKENDS[name](q, k, v, mask)
        tol = 1e-6 if name == "eager" else 1e-12  # eager's softmax runs in float32
        torch.testing.assert_close(got, want, rtol=0, atol=tol, msg=name)
    # without the limit the first four queries would see keys 28..31
    free = BACKENDS["sdpa"](q, k, v, AttentionMask(key_padding=pad))
    assert (free[:, :, :4] - want[:, :, :4]).abs().max() > 1e-3


def sparse_keep(lengths: list[int], block: int, copies: list[int] | None, seed: int) -> torch.Tensor:
    """bool keep over the whole layout of `bd3lm_mask(lengths, block, copies=copies)`: every clean
    copy whole; each (noisy copy, block) run kept or dropped whole at random, the first noisy copy
    of the first sample dropped entirely, and the last sample dropped whole (clean copy too)."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for s, n in enumerate(lengths):
        k = 1 if copies is None else copies[s]
        blocks = torch.arange(n) // block
        noisy = []
        for c in range(k):
            run = torch.rand(int(blocks.max()) + 1, generator=g) < 0.6
            noisy.append(run[blocks] & (s > 0 or c > 0))
        clean = torch.ones(n, dtype=torch.bool)
        seg = [*noisy, clean] if copies is None else [clean, *noisy]  # doubled: [x_t ; x_0]
        out = torch.cat(seg)
        parts.append(out & (s < len(lengths) - 1))
    return torch.cat(parts)


SPARSE = [([13, 4, 22, 5], 4, [3, 1, 2, 2]), ([9, 7, 3], 2, None), ([30, 17, 6], 8, [2, 4, 1]), ([5, 3, 2], 1, [2, 3, 1])]


@pytest.mark.parametrize(("lengths", "block", "copies"), SPARSE)
def test_a_layout_with_dropped_positions_is_the_whole_layout_restricted(lengths: list[int], block: int,
                                                                        copies: list[int] | None) -> None:
    """`bd3lm_mask(keep=)` is "masked equals selected": its dense mask is the whole layout's dense
    mask at the kept rows and columns; empty segments leave cu_seqlens; every backend agrees."""
    whole = bd3lm_mask(lengths, block, copies=copies)
    keep = sparse_keep(lengths, block, copies, seed=len(lengths) + block)
    sparse = bd3lm_mask(lengths, block, copies=copies, keep=keep)
    n, m = keep.numel(), int(keep.sum())
    full_dense, got = whole.dense(n, n, CPU), sparse.dense(m, m, CPU)
    assert full_dense is not None and got is not None
    assert torch.equal(got[0, 0], full_dense[0, 0][keep][:, keep])
    sizes = [(1 + (1 if copies is None else copies[s])) * length for s, length in enumerate(lengths)]
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(sizes))
    kept_sizes = [int(keep[seg == s].sum()) for s in range(len(lengths))]
    assert kept_sizes[-1] == 0 and sparse.cu_seqlens is not None
    assert sparse.cu_seqlens.tolist() == torch.tensor([0] + [k for k in kept_sizes if k]).cumsum(0).tolist()
    assert sparse.max_seqlen == max(kept_sizes)
    q, k, v = _qkv(1, 4, 2, m, m, seed=block)
    ref = attend(q, k, v, sparse, backend="eager")
    for backend in ("sdpa", "flex"):
        torch.testing.assert_close(attend(q, k, v, sparse, backend=backend), ref, rtol=1e-5, atol=1e-5, msg=backend)


def test_flex_block_mask_of_layouts_with_dropped_positions_matches_eager() -> None:
    """Random shared-clean packs with random (copy, block) runs dropped, tiles 16-128: the sparse
    BlockMask (`flex.tile_classes` from per-position ids) computes the dense mask's attention."""
    from dllm_models.flex import _eager_flex, build_block_mask

    g = torch.Generator().manual_seed(2)
    for i in range(12):
        n = int(torch.randint(2, 5, (), generator=g))
        lengths = torch.randint(1, 30, (n,), generator=g).tolist()
        copies = torch.randint(1, 6, (n,), generator=g).tolist()
        block = [1, 2, 3, 4, 8, 32][i % 6]
        tile = [16, 32, 128][i % 3]
        keep = sparse_keep(lengths, block, copies, seed=i)
        mask = bd3lm_mask(lengths, block_size=block, copies=copies, keep=keep)
        total = int(keep.sum())
        q, k, v = _qkv(1, 4, 2, total, total, seed=i)
        ref = attend(q, k, v, mask, backend="eager")
        out = _eager_flex(q, k, v, build_block_mask(mask, 1, total, total, CPU, tile=tile), True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=f"{lengths} {copies} {block} {tile}")


def test_keep_is_validated() -> None:
    with pytest.raises(ValueError, match=r"keep must be a bool \[total\] tensor over the layout's 12 positions"):
        bd3lm_mask([4], block_size=2, copies=[2], keep=torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="keep must be a bool"):
        bd3lm_mask([4], block_size=2, copies=[2], keep=torch.ones(12, dtype=torch.long))
    with pytest.raises(ValueError, match="drops every position"):
        bd3lm_mask([4], block_size=2, copies=[2], keep=torch.zeros(12, dtype=torch.bool))

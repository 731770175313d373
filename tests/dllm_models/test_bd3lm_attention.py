"""The BD3LM attention kernel (`dllm_models.kernels.bd3lm_attention`) and its tile schedule.

CPU: the schedule is exact at tile granularity (a tile is visited iff some query of it sees some
key of it; marked full iff every pair is visible) against the dense mask of `AttentionMask`, for
shared-clean and doubled layouts, block lengths 1, 4 and 32 and tile shapes that do not divide
them; the dK/dV pieces cover each walk once; the kernel (Triton interpreter, a subprocess with
TRITON_INTERPRET=1) in float32 equals a float64 reference in output and dq, dk, dv, with grouped
heads and several packed sequences, for every backward variant (`BD3LMKernelOptions.backward`);
a tiny SDAR scored on the packed path gives the same log-probs and gradients with the kernel as
with sdpa; every kernel compiles for sm_90. GPU (`-m gpu`): bf16 at SDAR-8B's head shape, each
backward variant, against a float32 reference, no further from it than twice flex's error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm_models.attention import AttentionMask, bd3lm_mask
from dllm_models.kernels.bd3lm_schedule import build_schedule, position_ids, visible_reference

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
LAYOUTS = [([13, 7, 20], 4, [2, 1, 3]), ([64, 40], 4, [3, 2]), ([50], 1, [2]), ([33, 31], 32, [1, 2]),
           ([30, 9], 4, None)]


def _tile_truth(dense: torch.Tensor, bm: int, bn: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(some pair visible, every pair visible) per (query tile, key tile); out-of-range pairs are
    invisible, so a ragged tile is never full."""
    n = dense.shape[0]
    tq, tk = -(-n // bm), -(-n // bn)
    grid = torch.zeros(tq * bm, tk * bn, dtype=torch.bool)
    grid[:n, :n] = dense
    tiles = grid.view(tq, bm, tk, bn)
    return tiles.any(3).any(1), tiles.all(3).all(1)


def _listed_table(num: torch.Tensor, idx: torch.Tensor, full: torch.Tensor, cols: int) -> tuple[torch.Tensor, ...]:
    sel = torch.zeros(num.numel(), cols, dtype=torch.bool)
    flag = torch.zeros_like(sel)
    for i in range(num.numel()):
        for j in range(int(num[i])):
            sel[i, idx[i, j]] = True
            flag[i, idx[i, j]] = bool(full[i, j])
    return sel, flag


@pytest.mark.parametrize(("lengths", "block", "copies"), LAYOUTS)
def test_schedule_visits_exactly_the_visible_tiles(lengths: list[int], block: int, copies: list[int] | None) -> None:
    mask = bd3lm_mask(lengths, block, copies=copies)
    _assert_schedule_exact(mask, int(mask.cu_seqlens[-1]))  # type: ignore[index]


def _assert_schedule_exact(mask: AttentionMask, n: int) -> None:
    """The element rule equals the dense mask, and every tile size's schedule lists exactly the tiles
    with a visible pair (and as full exactly those all visible), both ways."""
    dense = mask.dense(n, n, CPU)
    assert dense is not None
    ids = position_ids(mask, n, CPU)
    assert torch.equal(visible_reference(ids), dense[0, 0])
    for bm, bn in [(8, 8), (16, 8), (8, 16), (32, 32)]:
        s = build_schedule(ids, bm, bn, padded_keys=False)
        some, every = _tile_truth(dense[0, 0], bm, bn)
        sel, full = _listed_table(s.q_num, s.q_idx, s.q_full, some.shape[1])
        assert torch.equal(sel, some) and torch.equal(full, every), (bm, bn)
        sel_t, full_t = _listed_table(s.k_num, s.k_idx, s.k_full, some.shape[0])
        assert torch.equal(sel_t, some.T) and torch.equal(full_t, every.T), (bm, bn)


@pytest.mark.parametrize(("lengths", "block", "copies"), [([13, 7, 20, 3], 4, [2, 1, 3, 1]), ([64, 40, 9], 4, [3, 2, 2]),
                                                      ([50, 8], 1, [2, 1]), ([33, 31, 2], 32, [1, 2, 1]),
                                                      ([30, 9, 5], 4, None)])
def test_schedule_is_exact_on_layouts_with_dropped_blocks(lengths: list[int], block: int,
                                                          copies: list[int] | None) -> None:
    """Noisy copies carrying only some of their blocks (`bd3lm_mask(keep=)`, the packed scorer's
    layout), a copy with none and a sample dropped whole: `intervals` accepts the row and the
    schedule is still exact at tile granularity."""
    from tests.dllm_models.test_attention import sparse_keep

    keep = sparse_keep(lengths, block, copies, seed=block)
    mask = bd3lm_mask(lengths, block, copies=copies, keep=keep)
    n = int(keep.sum())
    assert n < keep.numel()
    _assert_schedule_exact(mask, n)


def test_schedule_skips_most_tiles_of_a_long_row() -> None:
    """SDAR's block of 4, 2048 tokens, 3 noisy copies: the visited tiles are about the visible pairs."""
    mask = bd3lm_mask([2048], 4, copies=[3])
    n = 4 * 2048
    s = build_schedule(position_ids(mask, n, CPU), 128, 64, padded_keys=False)
    visited = int(s.q_num.sum())
    total = (n // 128) * (n // 64)
    # pairs: the clean copy's causal triangle and each noisy copy's clean prefix (about 4 half
    # squares of 2048^2), so about 4 * 2048^2 / 2 / (128 * 64) = 1024 tiles, plus the diagonal
    assert visited < 0.15 * total  # 12.5 % of the pairs are visible
    assert visited < 1.2 * 4 * 2048 ** 2 / 2 / (128 * 64)
    assert int(s.q_full.sum()) > 0.8 * visited  # nearly every visited tile runs without a mask


def test_schedule_rejects_a_layout_it_cannot_serve() -> None:
    """Clean positions out of block order: one clean run per segment is what the intervals assume."""
    from dllm_models.kernels.bd3lm_schedule import intervals

    blocks = torch.tensor([[1, 0, 0, 1]])
    mask = AttentionMask(block_ids=blocks, is_clean=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="ascend"):
        intervals(position_ids(mask, 4, CPU))


def test_tiles_and_options_are_validated() -> None:
    from dllm_models.kernels.bd3lm_attention import BD3LMKernelOptions, Tile

    with pytest.raises(ValueError, match="block_m=24"):
        Tile(24, 64)
    with pytest.raises(ValueError, match="warps"):
        Tile(64, 64, warps=3)
    assert Tile.parse("64x128w8s3") == Tile(64, 128, 8, 3) and Tile.parse("32x64") == Tile(32, 64)
    with pytest.raises(ValueError, match="MxNwWsS"):
        Tile.parse("64-128")
    with pytest.raises(ValueError, match="block_n=48"):
        Tile.parse("64x48w4s2")
    with pytest.raises(ValueError, match="backward='flash'.*split"):
        BD3LMKernelOptions(backward="flash")
    with pytest.raises(ValueError, match="dkdv_chunk=0"):
        BD3LMKernelOptions(dkdv_chunk=0)


def test_dkdv_pieces_cover_every_walk_once() -> None:
    """`dkdv_items`: each key tile's query walk cut into pieces of at most `chunk`, together the
    whole list exactly once, longest first; None gives one piece per key tile (empty ones too)."""
    from dllm_models.kernels.bd3lm_backward import dkdv_items

    mask = bd3lm_mask([64, 40], 4, copies=[3, 2])
    n = int(mask.cu_seqlens[-1])  # type: ignore[index]
    s = build_schedule(position_ids(mask, n, CPU), 8, 16, padded_keys=False)
    for chunk in (1, 3, 1000):
        items = dkdv_items(s, chunk)
        assert bool((items[:-1, 2] >= items[1:, 2]).all()) and bool((items[:, 2] <= chunk).all())
        assert bool((items[:, 2] > 0).all())
        for kt in range(s.k_num.numel()):
            mine = sorted((int(f), int(c)) for t, f, c in items.tolist() if t == kt)
            covered = [i for f, c in mine for i in range(f, f + c)]
            assert covered == list(range(int(s.k_num[kt]))), (chunk, kt)
    whole = dkdv_items(s, None)
    assert sorted(whole[:, 0].tolist()) == list(range(s.k_num.numel()))
    assert torch.equal(whole[:, 2], s.k_num[whole[:, 0].long()]) and bool((whole[:, 1] == 0).all())


_CODE = r"""
import torch
import dllm_models.attention as A
from dllm_models.attention import AttentionMask, bd3lm_mask
from dllm_models.kernels.bd3lm_attention import (BACKWARD_VARIANTS, INTERPRETER_TILING, BD3LMKernelOptions, Tile,
                                                  Tiling, bd3lm_attend, bd3lm_fits)

def reference(q, k, v, dense, go):
    # float64 attention over the dense mask with its gradients (grouped heads repeated)
    rep = q.shape[1] // k.shape[1]
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        qd, kd.repeat_interleave(rep, 1), vd.repeat_interleave(rep, 1), attn_mask=dense).nan_to_num(0.0)
    return (out, *torch.autograd.grad(out, (qd, kd, vd), go.double()))

g = torch.Generator().manual_seed(0)
odd = Tiling(forward=Tile(32, 16), dkdv=Tile(16, 16), dq=Tile(16, 32))
default = ("one_launch", 16)  # BD3LMKernelOptions()'s backward (chunked and fused: chunks 1 and 2, many pieces per key tile)
every = [(variant, chunk) for variant in BACKWARD_VARIANTS for chunk in ((1, 2) if variant in ("chunked", "fused")
                                                                        else (16,))]
cases = [([13, 7, 20], 4, [2, 1, 3], 4, 2, 16, INTERPRETER_TILING, every),   # SDAR's block, 3 sequences, GQA 2
         ([40, 9], 32, [1, 2], 4, 1, 32, odd, every),                        # LLaDA2's block, longer than a tile
         ([37], 1, [2], 2, 2, 16, INTERPRETER_TILING, [default]),           # block 1: causal clean, noisy sees itself
         ([30, 9], 4, None, 2, 1, 16, odd, [default, ("fused", 1)])]        # the doubled layout [x_t ; x_0]
for lengths, block, copies, hq, hkv, d, tiling, variants in cases:
    mask = bd3lm_mask(lengths, block, copies=copies)
    n = int(mask.cu_seqlens[-1])
    dense = mask.dense(n, n, torch.device("cpu"))
    # queries read through the strides of a [1, N, Hq, D] projection, as the families give them
    q = torch.randn(1, n, hq, d, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(1, hkv, n, d, generator=g, requires_grad=True)
    v = torch.randn(1, hkv, n, d, generator=g, requires_grad=True)
    assert bd3lm_fits(q, k, mask)
    go = torch.randn(q.shape, generator=g)
    want = reference(q, k, v, dense, go)
    for variant, chunk in variants:
        options = BD3LMKernelOptions(backward=variant, tiling=tiling, dkdv_chunk=chunk)
        out = bd3lm_attend(q, k, v, mask, options=options)
        got = (out, *torch.autograd.grad(out, (q, k, v), go))
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert a.shape == b.shape, (name, a.shape, b.shape)
            err = (a.double() - b).abs().max().item()
            assert err < 2e-5, (lengths, block, variant, chunk, name, err)

# the backend: the same function as sdpa through attend(), and a fallback where it does not fit
mask = bd3lm_mask([21, 11], 4, copies=[2, 1])
n = int(mask.cu_seqlens[-1])
q, k, v = (torch.randn(1, h, n, 16, generator=g) for h in (4, 2, 2))
err = (A.attend(q, k, v, mask, backend="bd3lm_kernel") - A.attend(q, k, v, mask, backend="sdpa")).abs().max().item()
assert err < 1e-5, err
pad = AttentionMask(key_padding=torch.ones(2, 8, dtype=torch.bool))
q2, k2 = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)
assert not bd3lm_fits(q2, k2, pad)
assert torch.equal(A.attend(q2, k2, k2, pad, backend="bd3lm_kernel"), A.attend(q2, k2, k2, pad, backend="sdpa"))

# a tiny SDAR scored on packed shared-clean rows: log-probs and gradients as with sdpa
from tests.tiny_rl import tiny_model
from dllm_train.packed_scoring import packed_token_logp
model = tiny_model("sdar", dtype=torch.float32)
bl = model.traits.block_length
s = 3 * bl + 2
clean = torch.randint(0, 12, (2, s), generator=g)  # ordinary tokens of the tiny vocabulary
ids = clean.repeat_interleave(3, 0)
noisy = torch.where(torch.rand(ids.shape, generator=g) < 0.5, torch.full_like(ids, model.traits.mask_token_id), ids)
attn = torch.ones_like(ids, dtype=torch.bool)
attn[3:, -2:] = False
grads = {}
for backend in ("sdpa", "bd3lm_kernel"):
    model.zero_grad()
    lp = packed_token_logp(model, noisy, attn, ids, ids, temperature=1.0, block_length=bl, backend=backend)
    lp.sum().backward()
    grads[backend] = (lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
a, b = grads["sdpa"], grads["bd3lm_kernel"]
assert (a[0] - b[0]).abs().max().item() < 1e-4, (a[0] - b[0]).abs().max().item()
assert len(a[1]) == len(b[1]) > 0
for x, y in zip(a[1], b[1]):
    assert (x - y).abs().max().item() <= 1e-4 * (1 + x.abs().max().item())
print("ok")
"""


@pytest.mark.slow
def test_bd3lm_kernel_in_interpreter_mode() -> None:
    """Kernel output, dq, dk, dv == float64 reference (GQA, packed, blocks 1/4/32, both layouts);
    the backend equals sdpa through `attend` and on a tiny SDAR's packed scoring."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _CODE], env=env, cwd=ROOT, timeout=1200, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


_SPARSE_CODE = r"""
import torch
from dllm_models.attention import bd3lm_mask
from dllm_models.kernels.bd3lm_attention import INTERPRETER_TILING, BD3LMKernelOptions, bd3lm_attend, bd3lm_fits
from tests.dllm_models.test_attention import sparse_keep

g = torch.Generator().manual_seed(0)
# the kernel on rows whose noisy copies carry only some blocks: output and dq, dk, dv against float64
for lengths, block, copies in (([13, 7, 20, 3], 4, [2, 1, 3, 1]), ([40, 9, 2], 32, [1, 2, 1])):
    keep = sparse_keep(lengths, block, copies, seed=block)
    mask = bd3lm_mask(lengths, block, copies=copies, keep=keep)
    n = int(keep.sum())
    dense = mask.dense(n, n, torch.device("cpu"))
    q = torch.randn(1, 4, n, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, n, 16, generator=g, requires_grad=True) for _ in range(2))
    assert bd3lm_fits(q, k, mask)
    go = torch.randn(q.shape, generator=g)
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qd, kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1),
                                                           attn_mask=dense)
    want = (ref, *torch.autograd.grad(ref, (qd, kd, vd), go.double()))
    out = bd3lm_attend(q, k, v, mask, options=BD3LMKernelOptions(tiling=INTERPRETER_TILING))
    got = (out, *torch.autograd.grad(out, (q, k, v), go))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a.double() - b).abs().max().item()
        assert err < 2e-5, (lengths, block, name, err)

# tiny SDAR and LLaDA2 scored on packed rows whose copies drop their un-noised blocks: the kernel
# gives the log-probs and gradients of sdpa (the same layout) and of the padded path
from tests.tiny_rl import tiny_model
from dllm_train.likelihood import Scorer
for family in ("sdar", "llada2"):
    model = tiny_model(family, dtype=torch.float32)
    bl = model.traits.block_length
    s = 3 * bl + 2
    clean = torch.randint(0, 12, (2, s), generator=g).repeat_interleave(3, 0)
    t = torch.rand(6, 1, generator=g) * 0.6
    noisy = torch.where(torch.rand(clean.shape, generator=g) < t, torch.full_like(clean, model.traits.mask_token_id),
                        clean)
    noisy[:, :bl] = clean[:, :bl]  # the prompt block: never noised, never in the row
    noisy[2] = clean[2]            # a copy with no noise at all
    attn = torch.ones_like(clean, dtype=torch.bool)
    attn[3:, :1] = False
    runs = {}
    for backend in ("sdpa", "bd3lm_kernel", None):
        model.zero_grad()
        lp = Scorer(model, attention=backend)(noisy, attn, clean)
        lp.sum().backward()
        runs[backend] = (lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    for other in ("sdpa", None):
        a, b = runs[other], runs["bd3lm_kernel"]
        assert (a[0] - b[0]).abs().max().item() < 1e-4, (family, other, (a[0] - b[0]).abs().max().item())
        assert len(a[1]) == len(b[1]) > 0
        for x, y in zip(a[1], b[1]):
            assert (x - y).abs().max().item() <= 1e-4 * (1 + x.abs().max().item()), (family, other)
print("ok")
"""


@pytest.mark.slow
def test_bd3lm_kernel_in_interpreter_mode_on_layouts_with_dropped_blocks() -> None:
    """Interpreter: the kernel on rows with dropped (copy, block) runs equals float64 attention in
    output and gradients; tiny SDAR and LLaDA2 scored with it equal sdpa and the padded path."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _SPARSE_CODE], env=env, cwd=ROOT, timeout=1200, capture_output=True,
                          text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_kernels_compile_for_hopper_without_a_gpu() -> None:
    """The forward and every backward variant's kernel with `GPU_TILING` compile to sm_90 machine
    code (Triton's real compiler, not the interpreter: what the interpreter tolerates and the
    compiler refuses shows here), with the unit strides specialised as Triton's launcher does."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import dllm_models.kernels.bd3lm_backward as B
    import dllm_models.kernels.bd3lm_forward as F
    from dllm_models.kernels.bd3lm_options import GPU_TILING

    ints = {"qseg_ptr", "kseg_ptr", "blk_ptr", "cp_ptr", "num_ptr", "idx_ptr", "full_ptr", "order_ptr", "k_idx_ptr",
            "k_full_ptr", "item_ptr", "q_num_ptr", "q_idx_ptr", "q_full_ptr", "q_order_ptr"}
    unit = {"sqd", "skd", "svd", "sdod", "sdqd", "sdkd", "sdvd", "sod"}
    kv, dq = GPU_TILING.dkdv, GPU_TILING.dq
    bwd = {"PRECISION": "tf32", "BLOCK_D": 128, "BLOCK_M1": kv.block_m, "BLOCK_N1": kv.block_n,
           "BLOCK_M2": dq.block_m, "BLOCK_N2": dq.block_n}
    runs = [(F._fwd_kernel, {"PRECISION": "tf32", "BLOCK_M": GPU_TILING.forward.block_m,
                             "BLOCK_N": GPU_TILING.forward.block_n, "BLOCK_D": 128}, GPU_TILING.forward, ())]
    for do_kv, do_q, atomic, fused in ((True, False, False, False), (False, True, False, False),  # split
                                       (True, True, True, False), (True, False, True, True)):   # chunked, fused
        f32 = ("dk_ptr", "dv_ptr") if atomic else ()
        runs.append((B._bwd_kernel, dict(bwd, DO_KV=do_kv, DO_Q=do_q, ATOMIC=atomic, FUSED=fused), kv,
                     f32 + (("dq_ptr",) if fused else ())))
    for fn, consts, tile, f32 in runs:
        consts = dict(consts, **{u: 1 for u in unit if u in fn.arg_names})
        sig = {n: "constexpr" if n in consts else ("*i32" if n in ints else "*fp32" if n in ("lse_ptr", "delta_ptr")
                                                     + f32 else "*bf16" if n.endswith("_ptr") else "fp32" if "scale"
                                                     in n else "i32") for n in fn.arg_names}
        src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": tile.warps, "num_stages": tile.stages})
        assert compiled.asm["cubin"] and "wgmma" in compiled.asm["ptx"], (fn.__name__, consts)  # Hopper tensor cores


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["split", "one_launch", "chunked", "fused"])
@pytest.mark.parametrize("block", [4, 32])
def test_bd3lm_kernel_matches_reference_on_gpu(block: int, variant: str) -> None:
    """bf16 at SDAR-8B's heads (32 query heads, 8 KV heads, head dim 128), two packed sequences
    with 3 and 2 noisy copies, every backward variant (chunks of 4 query tiles: several pieces
    per clean key tile): output and gradients against a float32 reference, within twice flex's
    own error (flex in bf16 on the same inputs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from dllm_models.attention import attend
    from dllm_models.kernels.bd3lm_attention import BD3LMKernelOptions, bd3lm_attend

    options = BD3LMKernelOptions(backward=variant, dkdv_chunk=4)

    mask = bd3lm_mask([700, 333], block, copies=[3, 2])
    n = int(mask.cu_seqlens[-1])  # type: ignore[index]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, n, 32, 128, generator=g, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(1, 8, n, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    go = torch.randn(1, 32, n, 128, generator=g, device="cuda", dtype=torch.bfloat16)
    dense = mask.dense(n, n, q.device)

    def run(backend: str, dtype: torch.dtype) -> list[torch.Tensor]:
        xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        if backend == "reference":
            out = torch.nn.functional.scaled_dot_product_attention(
                xs[0], xs[1].repeat_interleave(4, 1), xs[2].repeat_interleave(4, 1), attn_mask=dense)
        elif backend == "bd3lm_kernel":
            out = bd3lm_attend(*xs, mask, options=options)
        else:
            out = attend(*xs, mask, backend=backend)
        return [out.float(), *(t.float() for t in torch.autograd.grad(out, xs, go.to(dtype)))]

    ref = run("reference", torch.float32)
    got = run("bd3lm_kernel", torch.bfloat16)
    flex = run("flex", torch.bfloat16)
    for name, a, f, r in zip(("out", "dq", "dk", "dv"), got, flex, ref):
        err, flex_err = (a - r).abs().max().item(), (f - r).abs().max().item()
        assert err <= 2 * flex_err + 1e-3, (variant, name, err, flex_err)

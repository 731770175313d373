"""Fused elementwise kernels (RMSNorm + residual, q/k head norm + RoPE, SwiGLU) against the plain path.

CPU: the plain path of `layers` equals the formulas it replaces, and CPU models never take the
fused path. Slow: the Triton kernels in interpreter mode (TRITON_INTERPRET=1, a subprocess),
forward and backward, alone and inside every tiny family (logits, gradients, KV caches).
GPU: the kernels in float32 and bfloat16, and whole tiny models with kernels on vs off.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dllm_models import build_model
from dllm_models.layers import (
    DEFAULT_KERNELS,
    PLAIN,
    KernelConfig,
    RMSNorm,
    apply_rope,
    rope_cos_sin,
    rotate_heads,
    swiglu,
)
from tests.conftest import tiny_llada_config
from tests.dllm_models.tiny_configs import TINY_CONFIGS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["llada", *TINY_CONFIGS]
DENSE = ["llada", "Dream", "sdar"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are 0)."""
    a64, b64 = a.detach().double(), b.detach().double()
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def _tiny(family: str, dtype: torch.dtype, device: str, seed: int = 0) -> nn.Module:
    if family == "llada":  # the vocab of the other tiny configs, so `checks` ids fit
        raw = tiny_llada_config(vocab_size=64, embedding_size=64, mask_token_id=63, eos_token_id=62, pad_token_id=62)
    else:
        raw = TINY_CONFIGS[family]()
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(seed), std=0.2)  # type: ignore[operator]
    return model.to(device=device, dtype=dtype)


# ---- CPU: the plain path ------------------------------------------------------------------------


def test_plain_rotate_heads_is_norm_then_rope() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 16, generator=g)
    cos, sin = rope_cos_sin(torch.arange(5)[None].expand(2, -1) + 7, 8, 10000.0)
    norm = RMSNorm(16, 1e-6, scale_in_fp32=True)
    nn.init.normal_(norm.weight, generator=g)
    want = apply_rope(norm(x).transpose(1, 2), cos, sin, full_precision=False)
    torch.testing.assert_close(rotate_heads(x, cos, sin, norm=norm, full_precision=False), want, rtol=0, atol=0)
    want = apply_rope(x.transpose(1, 2), cos, sin, full_precision=True)
    torch.testing.assert_close(rotate_heads(x, cos, sin, norm=None, full_precision=True), want, rtol=0, atol=0)


def test_plain_add_forward_is_add_then_norm() -> None:
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(3, 4, 32, generator=g), torch.randn(3, 4, 32, generator=g)
    for scale in (False, True):
        norm = RMSNorm(32, 1e-5, scale_in_fp32=scale)
        y, s = norm.add_forward(x, r)
        torch.testing.assert_close(s, x + r, rtol=0, atol=0)
        torch.testing.assert_close(y, norm(x + r), rtol=0, atol=0)
        # the formula by hand: x * rsqrt(mean(x^2) + eps) * w
        want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
        torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


def test_cpu_tensors_take_the_plain_path() -> None:
    x = torch.randn(2, 3)
    assert not PLAIN.use_fused(x)
    if os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter runs the kernels on CPU
        assert not KernelConfig().use_fused(x)
        torch.testing.assert_close(swiglu(x, x, KernelConfig()), torch.nn.functional.silu(x) * x, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_switch_keeps_cpu_logits(family: str) -> None:
    model = _tiny(family, torch.float32, "cpu").eval()
    assert model.kernels == DEFAULT_KERNELS  # type: ignore[comparison-overlap]
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        on = model(ids).logits
        model.kernels = PLAIN  # type: ignore[assignment]
        off = model(ids).logits
    torch.testing.assert_close(on, off, rtol=0, atol=0)


# ---- shared comparisons (CPU interpreter and GPU) ---------------------------------------------


def _grads(out: torch.Tensor | tuple[torch.Tensor, ...], inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator(device=outs[0].device).manual_seed(seed)
    loss = sum((o.float() * torch.randn(o.shape, generator=g, device=o.device)).sum() for o in outs)
    return list(torch.autograd.grad(loss, inputs))


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def check_rms_norm(device: str, dtype: torch.dtype, tol: float) -> None:
    """Fused `RMSNorm` / `add_forward` == plain, forward (same dtype) and backward."""
    g = torch.Generator(device=device).manual_seed(0)
    fused = KernelConfig()
    for scale in (False, True):
        for d in (48, 256):
            x = torch.randn(3, 7, d, generator=g, device=device).to(dtype)
            r = torch.randn(3, 7, d, generator=g, device=device).to(dtype)
            norm = RMSNorm(d, 1e-6, scale_in_fp32=scale).to(device=device, dtype=dtype)
            nn.init.normal_(norm.weight, 1.0, 0.3, generator=g)
            ins = [_leaf(x), _leaf(r)]
            y_f, s_f = norm.add_forward(ins[0], ins[1], fused)
            assert y_f.dtype == dtype and s_f.dtype == dtype
            gf = _grads((y_f, s_f), [*ins, norm.weight], 1)
            ref = [_leaf(x), _leaf(r)]
            y_p, s_p = norm.add_forward(ref[0], ref[1], PLAIN)
            gp = _grads((y_p, s_p), [*ref, norm.weight], 1)
            assert _rel(y_f, y_p) < tol and _rel(s_f, s_p) == 0.0, (scale, d)
            for a, b in zip(gf, gp):
                assert _rel(a, b) < tol * 4, (scale, d, _rel(a, b))
            y_f = norm(ins[0], fused)
            y_p = norm(ref[0], PLAIN)
            assert _rel(y_f, y_p) < tol
            for a, b in zip(_grads(y_f, [ins[0], norm.weight], 2), _grads(y_p, [ref[0], norm.weight], 2)):
                assert _rel(a, b) < tol * 4


def check_norm_rope(device: str, dtype: torch.dtype, tol: float) -> None:
    """Fused `rotate_heads` == plain: full and partial rotary, with and without the head norm,
    on a strided split of a fused QKV projection (LLaDA2) and with per-row positions."""
    g = torch.Generator(device=device).manual_seed(3)
    fused = KernelConfig()
    for d, rot, with_norm, scale, full in ((16, 16, True, True, False), (16, 8, True, False, False),
                                           (16, 16, False, False, True), (16, 16, False, False, False),
                                           (24, 12, True, True, False), (24, 24, False, False, False)):
        qkv = torch.randn(2, 9, 3 + 2, d, generator=g, device=device).to(dtype)
        pos = torch.stack([torch.arange(9), torch.arange(9) + 5]).to(device)
        cos, sin = rope_cos_sin(pos, rot, 10000.0)
        norm = None
        if with_norm:
            norm = RMSNorm(d, 1e-6, scale_in_fp32=scale).to(device=device, dtype=dtype)
            nn.init.normal_(norm.weight, 1.0, 0.3, generator=g)
        params = [norm.weight] if norm is not None else []
        src_f, src_p = _leaf(qkv), _leaf(qkv)
        y_f = rotate_heads(src_f[:, :, :3], cos, sin, norm=norm, full_precision=full, kernels=fused)
        y_p = rotate_heads(src_p[:, :, :3], cos, sin, norm=norm, full_precision=full, kernels=PLAIN)
        assert y_f.shape == y_p.shape == (2, 3, 9, d) and y_f.dtype == dtype
        assert _rel(y_f, y_p) < tol, (rot, with_norm, _rel(y_f, y_p))
        for a, b in zip(_grads(y_f, [src_f, *params], 4), _grads(y_p, [src_p, *params], 4)):
            assert _rel(a, b) < tol * 4, (rot, with_norm, _rel(a, b))


def check_swiglu(device: str, dtype: torch.dtype, tol: float) -> None:
    """Fused `swiglu` == `silu(gate) * up`, forward and backward."""
    g = torch.Generator(device=device).manual_seed(5)
    gate = (torch.randn(4, 3000, generator=g, device=device) * 3).to(dtype)
    up = torch.randn(4, 3000, generator=g, device=device).to(dtype)
    a, b, c, d = _leaf(gate), _leaf(up), _leaf(gate), _leaf(up)
    y_f, y_p = swiglu(a, b, KernelConfig()), swiglu(c, d, PLAIN)
    assert y_f.dtype == dtype and _rel(y_f, y_p) < tol
    for x, y in zip(_grads(y_f, [a, b], 6), _grads(y_p, [c, d], 6)):
        assert _rel(x, y) < tol * 4


def check_model(family: str, device: str, dtype: torch.dtype, tol: float) -> None:
    """A whole tiny model: logits and every parameter's gradient with kernels on == off."""
    on = _tiny(family, dtype, device).train()
    off = _tiny(family, dtype, device).train()
    off.kernels = PLAIN  # type: ignore[assignment]
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(7)).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False
    outs = []
    for model in (on, off):
        logits = model(ids, attention_mask=mask).logits
        logits.float().logsumexp(-1)[mask].mean().backward()
        outs.append(logits)
    assert _rel(outs[0], outs[1]) < tol, (family, _rel(outs[0], outs[1]))
    for (name, p), q in zip(on.named_parameters(), off.parameters()):
        if q.grad is not None and q.grad.abs().max() > 0:
            assert p.grad is not None and _rel(p.grad, q.grad) < tol * 4, (family, name, _rel(p.grad, q.grad))


# ---- slow: Triton interpreter on CPU ----------------------------------------------------------

# float32 only: the interpreter rounds float32 -> bfloat16 by truncation, the GPU to nearest even
_KERNELS_CODE = """
import torch
from tests.dllm_models import test_kernels as t
t.check_rms_norm('cpu', torch.float32, 1e-5)
t.check_norm_rope('cpu', torch.float32, 1e-5)
t.check_swiglu('cpu', torch.float32, 1e-5)
print('ok')
"""
_FAMILIES_CODE = """
import torch
from tests.dllm_models import test_kernels as t, checks
for fam in t.FAMILIES:
    t.check_model(fam, 'cpu', torch.float32, 1e-5)
    model = t._tiny(fam, torch.float32, 'cpu').eval()
    assert model.kernels.use_fused(torch.zeros(1))
    with torch.no_grad():
        checks.check_left_padding(model)
        block = getattr(model, 'traits').block_length
        if block is None:
            checks.check_kv_cache_bidirectional(model)
        else:
            checks.check_kv_cache_block_causal(model, block)
        checks.check_in_place_cache(model, block)
print('ok')
"""


def _interpret(code: str) -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, timeout=600, capture_output=True, text=True
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_triton_kernels_in_interpreter_mode() -> None:
    """The kernels themselves (Triton interpreter on CPU) == the plain path, fwd and bwd."""
    _interpret(_KERNELS_CODE)


@pytest.mark.slow
def test_tiny_families_with_kernels_in_interpreter_mode() -> None:
    """Every tiny family with the kernels on: logits and gradients == kernels off, and the
    padding and KV-cache properties still hold (Triton interpreter on CPU, ~2 minutes)."""
    _interpret(_FAMILIES_CODE)


def _signatures(dt: str) -> list[tuple[str, str, dict[str, str], dict[str, object]]]:
    """(module, kernel, argument types, constexprs) of each kernel at an 8B shape."""
    i32 = "i32"
    rms = {"X": dt, "R": dt, "S": dt, "Y": dt, "W": dt, "RSTD": "*fp32", "stride_x": i32, "stride_r": i32,
           "stride_s": i32, "stride_y": i32, "n_cols": i32, "eps": "fp32"}
    rms_b = {"X": dt, "W": dt, "RSTD": "*fp32", "DY": dt, "DS": dt, "DX": dt, "DW": "*fp32", "stride_x": i32,
             "stride_dy": i32, "stride_ds": i32, "stride_dx": i32, "n_rows": i32, "n_cols": i32, "rows_per_prog": i32}
    rope = {"X": dt, "Y": dt, "W": dt, "COS": "*fp32", "SIN": "*fp32", "RSTD": "*fp32", "sxb": i32, "sxl": i32,
            "sxh": i32, "seq_len": i32, "n_heads": i32, "head_dim": i32, "cs_stride": i32, "eps": "fp32"}
    rope_b = {"X": dt, "DY": dt, "DX": dt, "W": dt, "DW": "*fp32", "COS": "*fp32", "SIN": "*fp32", "RSTD": "*fp32",
              "sxb": i32, "sxl": i32, "sxh": i32, "sdb": i32, "sdl": i32, "sdh": i32, "n_tokens": i32,
              "seq_len": i32, "n_heads": i32, "head_dim": i32, "cs_stride": i32, "tokens_per_prog": i32}
    glu = {"G": dt, "U": dt, "Y": dt, "n": i32}
    glu_b = {"G": dt, "U": dt, "DY": dt, "DG": dt, "DU": dt, "n": i32}
    out: list[tuple[str, str, dict[str, str], dict[str, object]]] = []
    for flag in (True, False):
        out.append(("rmsnorm", "_rms_fwd", rms, {"HAS_RES": flag, "SCALE_FP32": flag, "BLOCK": 4096}))
        out.append(("rmsnorm", "_rms_bwd", rms_b, {"HAS_DS": flag, "SCALE_FP32": not flag, "BLOCK": 4096}))
    for norm, scale, full, half, rest in ((True, True, False, 64, 1), (True, False, False, 32, 64),
                                          (False, False, True, 64, 1)):
        c: dict[str, object] = {"HALF": half, "HAS_NORM": norm, "SCALE_FP32": scale, "FULL_PREC": full,
                                "BLOCK_H": 32, "BLOCK_HALF": half, "BLOCK_PASS": rest}
        out.append(("rope", "_norm_rope_fwd", rope, c))
        out.append(("rope", "_norm_rope_bwd", rope_b, c))
    out.append(("glu", "_swiglu_fwd", glu, {"BLOCK": 1024}))
    out.append(("glu", "_swiglu_bwd", glu_b, {"BLOCK": 1024}))
    return out


@pytest.mark.slow
def test_kernels_compile_for_sm90_without_a_gpu() -> None:
    """Every kernel compiles to a Hopper cubin with Triton's bundled ptxas (no GPU needed), so a
    front-end error shows on CPU machines too."""
    import importlib

    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this Triton has no ASTSource/GPUTarget API")
    for dt in ("*bf16", "*fp32"):
        for module, name, sig, consts in _signatures(dt):
            fn = getattr(importlib.import_module(f"dllm_models.kernels.{module}"), name)
            full = {**sig, **{k: "constexpr" for k in consts}}
            compiled = triton.compile(ASTSource(fn, full, consts), target=GPUTarget("cuda", 90, 32))
            assert compiled.asm.get("cubin"), (module, name, consts)


# ---- GPU --------------------------------------------------------------------------------------

_GPU_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_plain_on_gpu(dtype: torch.dtype) -> None:
    check_rms_norm("cuda", dtype, _GPU_TOL[dtype])
    check_norm_rope("cuda", dtype, _GPU_TOL[dtype])
    check_swiglu("cuda", dtype, _GPU_TOL[dtype])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_kernels_on_vs_off_on_gpu(family: str, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and family not in DENSE:
        pytest.skip("bf16 rounding can flip an MoE router's top-k; MoE families run in float32")
    check_model(family, "cuda", dtype, _GPU_TOL[dtype] * (3 if dtype == torch.bfloat16 else 10))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", DENSE)
def test_bf16_fused_error_against_float32_is_no_worse_than_plain_on_gpu(family: str) -> None:
    """bf16 with the kernels is as close to the float32 model as bf16 without them.

    The fused kernels keep float32 in registers where the plain path rounds intermediate products
    to bf16, so their bf16 outputs are not bit-equal to the plain ones; what matters is that they
    are no further from the exact (float32) function.
    """
    ref = _tiny(family, torch.float32, "cuda").eval()
    ids = torch.randint(0, 40, (4, 48), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        exact = ref(ids).logits.float()
        errors = {}
        for fused in (True, False):
            model = _tiny(family, torch.bfloat16, "cuda").eval()
            if not fused:
                model.kernels = PLAIN  # type: ignore[assignment]
            errors[fused] = _rel(model(ids).logits.float(), exact)
    assert errors[True] <= 1.25 * errors[False] + 1e-3, (family, errors)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_kv_cache_decoding_on_gpu(family: str) -> None:
    """KV-cached decoding with the fused kernels equals the full forward (float32, CUDA)."""
    model = _tiny(family, torch.float32, "cuda").eval()
    n = 16
    ids = torch.randint(0, 40, (2, n), generator=torch.Generator().manual_seed(3)).cuda()
    pos = torch.arange(n, device="cuda")[None].expand(2, -1)
    with torch.no_grad():
        full = model(ids, position_ids=pos).logits
        cache = model(ids, position_ids=pos, use_cache=True).past_key_values
        tail = model(ids[:, 8:], position_ids=pos[:, 8:], past_key_values=cache.slice(0, 8)).logits
    torch.testing.assert_close(tail, full[:, 8:], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", DENSE)  # MoE routing syncs with the host
def test_fused_forward_replays_in_a_cuda_graph_on_gpu(family: str) -> None:
    """The fused kernels capture into a CUDA graph (the decoders graph their steps)."""
    model = _tiny(family, torch.bfloat16, "cuda").eval()
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(4)).cuda()
    with torch.no_grad():
        want = model(ids).logits.clone()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(ids)  # warm-up: Triton compiles here, never during capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(ids).logits
        graph.replay()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_kernel_config_defaults_and_bad_values() -> None:
    """Every kernel on by default (today's behaviour), validated values, flex tiles as the dict flex takes."""
    from dllm_models.layers import KernelConfig

    k = KernelConfig()
    assert (k.fused, k.decode_attention, k.decode_span, k.decode_splits, k.decode_max_rows, k.decode_block_n,
            k.decode_stages, k.flex_options) == (True, True, True, 1, 64, 128, 2, None)
    assert k.bd3lm_options.backward == "one_launch" and k.bd3lm_options.dkdv_chunk == 16
    with pytest.raises(ValueError, match="bd3lm_backward='flash'"):
        KernelConfig(bd3lm_backward="flash")
    with pytest.raises(ValueError, match="bd3lm_dkdv_chunk"):
        KernelConfig(bd3lm_dkdv_chunk=0)
    tiles = KernelConfig(flex_kernel_options=(("BLOCK_M", 64), ("BLOCK_N", 32)))
    assert tiles.flex_options == {"BLOCK_M": 64, "BLOCK_N": 32} and hash(tiles) == hash(dataclasses.replace(tiles))
    for bad, match in (({"decode_splits": 0}, r"kernels\.decode_splits must be >= 1, got 0"),
                       ({"decode_max_rows": 256}, r"kernels\.decode_max_rows must be <= 128"),
                       ({"decode_block_n": 96}, r"kernels\.decode_block_n must be a power of two"),
                       ({"flex_kernel_options": (("BLOCK_M",),)}, r"kernels\.flex_kernel_options must be")):
        with pytest.raises(ValueError, match=match):
            KernelConfig(**bad)  # type: ignore[arg-type]


def test_set_kernels_takes_a_family_and_a_kernel_config() -> None:
    from dllm_models import KernelConfig, set_kernels
    from tests.dllm_models.tiny_configs import build_tiny

    model = build_tiny("llada")
    assert set_kernels(model, KernelConfig(decode_splits=2)) is model
    assert model.kernels == KernelConfig(decode_splits=2)
    with pytest.raises(TypeError, match="is not a dllm_models family"):
        set_kernels(torch.nn.Linear(2, 2), KernelConfig())
    with pytest.raises(TypeError, match="kernels must be a dllm_models.KernelConfig"):
        set_kernels(model, {"fused": False})  # type: ignore[arg-type]

"""The fused proposal kernel (`dllm_rollout.fused_sampling`) against the unfused path it replaces.

CPU: the top-k threshold against `filter_logits` (ties, the mask id among the k largest) and the
dispatch rule. Slow: the kernel in Triton interpreter mode (a subprocess) against `propose` +
`confidence` on logits full of ties, and whole tiny decodes with it on and off. GPU: the same in
float32 and bfloat16.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_rollout import SpeedConfig, fused_sampling, generate
from dllm_rollout.noise import RowNoise
from dllm_rollout.sampling import filter_logits, fuses, propose_scored

ROOT = Path(__file__).resolve().parents[2]
V, MASK = 9_000, 8_000  # three kernel blocks of 4,096; the mask id inside the last


def _logits(rows: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """[rows, V] logits on a 0.25 grid (ties everywhere, at the k-th value too); the mask id is the
    most likely token of every third row."""
    g = torch.Generator().manual_seed(seed)
    x = ((torch.randn(rows, V, generator=g) * 12).round() / 4)
    x[::3, MASK] = 40.0
    return x.to(dtype).to(device)


@pytest.mark.parametrize("top_k", [1, 7, 50, V - 1])
def test_top_k_threshold_keeps_what_filter_logits_keeps(top_k: int) -> None:
    logits = _logits(12, torch.float32, "cpu")
    masked = logits.clone()
    masked[:, MASK] = float("-inf")
    kept = filter_logits(masked, top_k, None) > float("-inf")
    kth = fused_sampling.top_k_threshold(logits, top_k, MASK)
    mine = (logits >= kth[:, None]) & (torch.arange(V) != MASK)
    assert torch.equal(mine, kept)
    assert int(kept.sum(-1).min()) >= min(top_k, V - 1)
    assert int(kept.sum(-1).max()) > top_k or top_k >= V - 1  # ties at the k-th value are kept


def test_only_cuda_logits_and_kernel_confidences_take_the_fused_path() -> None:
    cpu = torch.zeros(2, 3)
    assert not fuses(cpu, "maskgit_plus", None)  # CPU runs the unfused path (outside the interpreter)
    if torch.cuda.is_available() and fused_sampling.HAS_TRITON:
        gpu = cpu.cuda()
        assert fuses(gpu, "low_confidence", None) and fuses(gpu, "origin", 1.0)
        assert fuses(gpu, "low_confidence_dynamic", None) and not fuses(gpu, "low_confidence_dynamic", 0.95)
        assert not fuses(gpu, "entropy", None) and not fuses(gpu, "topk_margin", None)
        assert not fuses(gpu, "maskgit_plus", 0.9)
        assert not fuses(gpu, "maskgit_plus", None, fused=False)  # speed.fused_sampling=False


def check_against_unfused(device: str, dtype: torch.dtype) -> None:
    """`propose_scored` fused == unfused: the same tokens, confidences and log-probs, and the same
    noise consumed, for every temperature, top-k and confidence the kernel serves."""
    assert fuses(torch.zeros(1, device=device), "maskgit_plus", None)
    assert not fuses(torch.zeros(1, device=device), "maskgit_plus", None, fused=False)
    b, n = 8, 6
    logits = _logits(b * n, dtype, device).view(b, n, V)
    active = torch.tensor([True, True, False, True, True, True, False, True], device=device)
    for temperature in (0.0, 0.7, 1.0):
        for top_k in (None, 1, 7, 50):
            for remasking in ("maskgit_plus", "low_confidence", "random"):
                out = []
                for fused in (True, False):
                    noise = RowNoise(torch.arange(b) + 3, device)
                    got = propose_scored(logits, remasking=remasking, temperature=temperature, top_k=top_k,
                                         top_p=None, noise=noise, active=active, mask_id=MASK, fused=fused)
                    out.append((*got, noise.drawn.clone()))
                where = (temperature, top_k, remasking)
                (x0, conf, logp, drawn), (x0_ref, conf_ref, logp_ref, drawn_ref) = out
                assert torch.equal(x0, x0_ref), where
                assert not bool((x0 == MASK).any()), where
                assert torch.equal(drawn, drawn_ref), where
                torch.testing.assert_close(conf, conf_ref, rtol=1e-5, atol=1e-6, msg=str(where))
                torch.testing.assert_close(logp, logp_ref, rtol=1e-5, atol=1e-4, msg=str(where))


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]
DECODES: list[tuple[str, dict[str, Any]]] = [
    ("llada", {"cache": "dual", "temperature": 0.6}),  # LLaDA: raw confidences
    ("Dream", {"cache": None, "temperature": 1.0, "top_k": 20}),  # maskgit_plus
    ("sdar", {"cache": "prefix", "temperature": 1.0, "top_k": 20}),  # block diffusion
    ("sdar", {"cache": "prefix", "temperature": 0.0}),
]
# GPU only (the interpreter run is slow enough): DARE's threshold rule, whose confidence is the kernel's
# exp(logp), compared above for every setting
GPU_DECODES: list[tuple[str, dict[str, Any]]] = [
    ("sdar", {"cache": "prefix", "temperature": 1.0, "top_k": 20, "remasking": "low_confidence_dynamic",
              "threshold": 0.05}),
]


def check_decodes(device: str, model_kernels: Any = None) -> None:
    """Whole tiny decodes with the kernel on and off: the same tokens and step log-probs (the models
    run with `model_kernels`, a `KernelConfig`; None: their default)."""
    from tests.dllm_models.tiny_configs import build_tiny

    for family, kwargs in DECODES + (GPU_DECODES if device == "cuda" else []):
        model = build_tiny(family).to(device)
        if model_kernels is not None:
            model.kernels = model_kernels
        bl = int(getattr(model, "traits").block_length or 8)
        out = []
        for fused in (True, False):
            out.append(generate(model, PROMPTS, seed=4, record_trajectory=True, max_new_tokens=16,
                                block_length=bl, steps=16 if bl == 8 else bl, speed=SpeedConfig(fused_sampling=fused),
                                **kwargs))
        assert torch.equal(out[0].response_ids, out[1].response_ids), (family, kwargs)
        torch.testing.assert_close(out[0].step_logp, out[1].step_logp, rtol=0, atol=1e-4)


# float32 only on CPU: the interpreter rounds float32 -> bfloat16 by truncation, the GPU to nearest even
_INTERPRETED = """
import torch
from dllm_models.layers import KernelConfig
from tests.dllm_rollout import test_fused_sampling as t
t.check_against_unfused('cpu', torch.float32)
t.check_decodes('cpu', KernelConfig(fused=False))
print('ok')
"""


@pytest.mark.slow
def test_fused_draw_in_interpreter_mode() -> None:
    """The kernel itself (Triton interpreter on CPU; the models' own kernels off) == the unfused path."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, cwd=ROOT, timeout=900,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_fused_draw_compiles_for_sm90_without_a_gpu() -> None:
    """The kernel compiles to a Hopper cubin with Triton's bundled ptxas (no GPU needed)."""
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this Triton has no ASTSource/GPUTarget API")
    for dt in ("*bf16", "*fp32"):
        for greedy in (True, False):
            sig = {"X": dt, "U": "*fp32", "KTH": "*fp32", "X0": "*i64", "LOGP": "*fp32", "PROB": "*fp32",
                   "RAW": "*fp32", "stride_row": "i32", "n_cols": "i32", "inv_temp": "fp32", "mask_id": "i32",
                   "GREEDY": "constexpr", "BLOCK": "constexpr"}
            consts = {"GREEDY": greedy, "BLOCK": fused_sampling.BLOCK_V}
            compiled = triton.compile(ASTSource(fused_sampling._draw_kernel, sig, consts),
                                      target=GPUTarget("cuda", 90, 32))
            assert compiled.asm.get("cubin"), (dt, greedy)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_draw_on_gpu(dtype: torch.dtype) -> None:
    check_against_unfused("cuda", dtype)


@pytest.mark.gpu
@needs_cuda
def test_fused_draw_in_tiny_decodes_on_gpu() -> None:
    check_decodes("cuda")

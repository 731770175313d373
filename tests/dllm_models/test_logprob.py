"""Chunked (and Triton) token log-probs equal the naive log_softmax in values and gradients."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm_models.logprob import (
    final_hidden,
    lm_head_and_hidden,
    model_token_logprobs,
    naive_token_logprobs,
    token_logprobs,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _problem(n: int = 37, h: int = 16, v: int = 103, dtype: torch.dtype = torch.float32, device: str = "cpu"):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(device, dtype).requires_grad_(True)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(device, dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g).to(device)
    targets[3] = -100
    grad_out = torch.randn(n, generator=g).to(device)
    return hidden, weight, targets, grad_out


def _compare(backend: str, *, dtype: torch.dtype, device: str, tol: float, chunk: int, temp: float) -> None:
    hidden, weight, targets, grad_out = _problem(dtype=dtype, device=device)
    out = token_logprobs(hidden, weight, targets, chunk_size=chunk, temperature=temp, backend=backend)
    ref = naive_token_logprobs(hidden, weight, targets, temperature=temp)
    assert out.dtype == torch.float32 and out[3] == 0
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    g_out = torch.autograd.grad((out * grad_out).sum(), (hidden, weight))
    g_ref = torch.autograd.grad((ref * grad_out).sum(), (hidden, weight))
    for a, r in zip(g_out, g_ref):
        torch.testing.assert_close(a.float(), r.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
@pytest.mark.parametrize("temp", [1.0, 0.6])
def test_chunked_equals_naive(chunk: int, temp: float) -> None:
    _compare("chunked", dtype=torch.float32, device="cpu", tol=1e-5, chunk=chunk, temp=temp)


def test_chunked_never_saves_full_logits() -> None:
    hidden, weight, targets, grad_out = _problem(n=64, v=211)
    sizes: list[int] = []

    def pack_hook(x: torch.Tensor) -> torch.Tensor:
        sizes.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda x: x):
        out = token_logprobs(hidden, weight, targets, chunk_size=16)
    assert max(sizes) < 64 * 211  # only hidden, weight, targets and the per-token lse are kept
    (out * grad_out).sum().backward()


def test_frozen_head_gets_no_gradient() -> None:
    hidden, weight, targets, _ = _problem()
    out = token_logprobs(hidden, weight.detach(), targets, chunk_size=8)
    out.sum().backward()
    assert hidden.grad is not None and weight.grad is None


def test_model_path_matches_logits(tiny_llada: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 48, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :2] = False
    targets = torch.randint(0, 50, (2, 9), generator=g)
    targets[0, :4] = -100
    logits = tiny_llada(ids, attention_mask=mask).logits
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    ref = torch.where(targets >= 0, ref, torch.zeros_like(ref))
    out = model_token_logprobs(tiny_llada, ids, targets, chunk_size=5, attention_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    hidden = final_hidden(tiny_llada, ids, attention_mask=mask)
    assert hidden.shape == (2, 9, 64)


def test_logit_shift_reads_previous_position(tiny_llada: torch.nn.Module) -> None:
    from dataclasses import replace

    ids = torch.randint(0, 48, (1, 6), generator=torch.Generator().manual_seed(4))
    plain, _ = lm_head_and_hidden(tiny_llada, ids)
    tiny_llada.traits = replace(tiny_llada.traits, logit_shift=1)  # type: ignore[arg-type]
    shifted, _ = lm_head_and_hidden(tiny_llada, ids)
    assert torch.equal(shifted[:, 1:], plain[:, :-1]) and torch.equal(shifted[:, 0], plain[:, 0])


def test_bad_inputs_name_the_shapes() -> None:
    hidden, weight, targets, _ = _problem()
    with pytest.raises(ValueError, match="targets must be"):
        token_logprobs(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="backend must be one of"):
        token_logprobs(hidden, weight, targets, backend="cuda")


@pytest.mark.slow
def test_triton_kernels_in_interpreter_mode() -> None:
    pytest.importorskip("triton")
    code = (
        "from tests.dllm_models.test_logprob import _compare\n"
        "for c in (8, 64):\n"
        "    _compare('triton', dtype=__import__('torch').float32, device='cpu', tol=1e-5, chunk=c, temp=0.7)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root, timeout=300)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_equals_naive_on_gpu(dtype: torch.dtype) -> None:
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    _compare("triton", dtype=dtype, device="cuda", tol=tol, chunk=16, temp=0.8)


@pytest.mark.gpu
@needs_cuda
def test_triton_large_vocab_memory_on_gpu() -> None:
    n, h, v = 4096, 1024, 126464
    hidden = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / 32).requires_grad_(True)
    targets = torch.randint(0, v, (n,), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = token_logprobs(hidden, weight, targets, chunk_size=1024)
    out.sum().backward()
    fused_peak = torch.cuda.max_memory_allocated() - base
    ref = naive_token_logprobs(hidden.detach(), weight.detach(), targets)
    torch.testing.assert_close(out.detach(), ref, rtol=2e-2, atol=5e-2)
    assert fused_peak < n * v * 2  # below one bf16 copy of the full logits

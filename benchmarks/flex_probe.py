"""FlexAttention probe on the GPU: the BD3LM backward that failed to compile at a short odd length,
and block-causal kernel tile options at the SDAR-8B training shape.

    python benchmarks/flex_probe.py        # H200, ~2 min (each option set compiles anew)
"""

from __future__ import annotations

import json
import time
import traceback
from typing import Any

import torch

from dllm_models import flex
from dllm_models.attention import AttentionMask, attend, bd3lm_mask
from dllm_models.layers import KernelConfig

OPTIONS: list[dict[str, Any] | None] = [
    None,
    {"BLOCK_M": 64, "BLOCK_N": 64},
    {"BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
]


def _reset(options: dict[str, Any] | None) -> KernelConfig:
    """Fresh compilation, and the kernels that hand `options` to the flex backend."""
    flex._compiled_flex.cache_clear()
    torch._dynamo.reset()
    return KernelConfig(flex_kernel_options=None if options is None else tuple(options.items()))


def small_bd3lm(options: dict[str, Any] | None) -> str:
    """The unit test's case: BD3LM lengths 13, 4, 22 (78 positions), 8 q / 2 kv heads, d 64, bf16."""
    kernels = _reset(options)
    m = bd3lm_mask([13, 4, 22], block_size=4, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 8, 78, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    k = torch.randn(1, 2, 78, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    v = torch.randn(1, 2, 78, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    try:
        out = attend(q, k, v, m, backend="flex", kernels=kernels)
        out.float().square().sum().backward()
        ref = attend(q.detach(), k.detach(), v.detach(), m, backend="sdpa")
        return f"ok (max |flex - sdpa| {float((out - ref).abs().max()):.3g})"
    except Exception as err:  # noqa: BLE001 - report and go on
        text = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()
        return f"FAILED {type(err).__name__}: {' | '.join(text[-6:])[:1500]}"


def sdar_block_causal(options: dict[str, Any] | None) -> str:
    """Attention alone at SDAR-8B's training shape: 32 q / 8 kv heads, d 128, packed block-causal
    rows of the benchmark's 8 lengths (4259 tokens), block 4; fwd + bwd ms."""
    kernels = _reset(options)
    lengths = [1024, 811, 640, 533, 421, 356, 270, 204]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    blocks = torch.cat([torch.arange(n) // 4 for n in lengths])[None].cuda()
    m = AttentionMask(cu_seqlens=cu, max_seqlen=max(lengths), block_ids=blocks)
    t = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 32, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    k = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    v = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    try:
        for _ in range(3):
            attend(q, k, v, m, backend="flex", kernels=kernels).sum().backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            attend(q, k, v, m, backend="flex", kernels=kernels).sum().backward()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 20 * 1e3
        pairs = sum(n * (n // 4 * 4 + 4) / 2 for n in lengths)  # ~ allowed pairs of block-causal rows
        tflops = 4 * 32 * 128 * pairs * 3.5 / (ms / 1e3) / 1e12  # fwd 2 matmuls + bwd 5 ~ 3.5x fwd
        return f"{ms:.2f} ms fwd+bwd (~{tflops:.0f} TFLOP/s)"
    except Exception as err:  # noqa: BLE001
        return f"FAILED {type(err).__name__}: {str(err)[:400]}"


def main() -> None:
    results = []
    for opt in OPTIONS:
        row = {"options": opt, "bd3lm_small_backward": small_bd3lm(opt), "sdar_block_causal": sdar_block_causal(opt)}
        print(json.dumps(row), flush=True)
        results.append(row)


if __name__ == "__main__":
    main()

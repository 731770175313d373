"""Attention of one cached decoding step with left-padded prompts: which kernel path is fast.

Fast-dLLM's dual-cache step at LLaDA-8B's shape, batch 64: 32 queries per row against a 512-key
canvas with per-row key padding (prompts of different lengths). Times the attention call alone
under several mask forms, then a 4-layer LLaDA-8B-width model's dual step with and without
padding (the step's other work does not depend on padding).

    python benchmarks/decode_attention_probe.py     # H200, < 1 min
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def ms(fn: Callable[[], Any], reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    torch.manual_seed(0)
    b, h, lq, lk, d = 64, 32, 32, 512, 128
    q = torch.randn(b, h, lq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, h, lk, d, device="cuda", dtype=torch.bfloat16)
    pad = torch.randint(0, 128, (b,), device="cuda")
    keep = torch.arange(lk, device="cuda")[None] >= pad[:, None]  # [B, Lk]
    bool_mask = keep[:, None, None, :]
    float_mask = torch.zeros(b, 1, 1, lk, device="cuda", dtype=torch.bfloat16).masked_fill(~bool_mask, float("-inf"))
    rows: dict[str, float] = {}
    rows["no mask (wrong result, floor)"] = ms(lambda: F.scaled_dot_product_attention(q, k, v))
    rows["bool [B,1,1,Lk]"] = ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask))
    rows["bf16 additive [B,1,1,Lk]"] = ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask))
    exp = float_mask.expand(b, h, lq, lk)
    rows["bf16 additive expanded view"] = ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=exp))
    for name, backend in [("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("math", SDPBackend.MATH)]:
        try:
            with sdpa_kernel(backend):
                rows[f"forced {name}, bf16 additive"] = ms(
                    lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask))
        except Exception as err:  # noqa: BLE001
            rows[f"forced {name}, bf16 additive: {type(err).__name__}"] = float("nan")
    from dllm_models.attention import AttentionMask, attend

    am = AttentionMask(key_padding=keep)
    rows["dllm attend sdpa (key_padding)"] = ms(lambda: attend(q, k, v, am, backend="sdpa"))
    try:
        rows["dllm attend flex (key_padding)"] = ms(lambda: attend(q, k, v, am, backend="flex"))
    except Exception as err:  # noqa: BLE001
        rows[f"dllm attend flex: {type(err).__name__}"] = float("nan")

    # a 4-layer LLaDA-8B-width model: the dual step with and without padded rows
    from pathlib import Path

    from dllm_models import build_model
    from dllm_rollout import SamplingConfig, decode

    raw = json.loads((Path(__file__).parent / "configs" / "LLaDA-8B-Instruct" / "config.json").read_text())
    raw["n_layers"] = 4
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = build_model(raw).eval()
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(0, 100_000, (b, 256), device="cuda")
    full = torch.ones_like(ids, dtype=torch.bool)
    left = torch.arange(256, device="cuda")[None] >= torch.randint(0, 128, (b, 1), device="cuda")
    seeds = torch.arange(b)
    for temp in (0.0, 0.6):
        cfg = SamplingConfig(max_new_tokens=64, block_length=32, steps=32, cache="dual", temperature=temp)
        for label, mask in (("unpadded", full), ("left-padded", left)):
            rows[f"4-layer dual decode 2 blocks (32 steps) T={temp} {label}"] = ms(
                lambda: decode(model, ids, mask, seeds, cfg), reps=2)
        nc = SamplingConfig(max_new_tokens=64, block_length=32, steps=32, temperature=temp)
        for label, mask in (("unpadded", full), ("left-padded", left)):
            rows[f"4-layer no-cache decode 2 blocks (32 steps) T={temp} {label}"] = ms(
                lambda: decode(model, ids, mask, seeds, nc), reps=2)
    for key, val in rows.items():
        print(f"{key:70s} {val:9.3f} ms")


if __name__ == "__main__":
    main()

"""Fused elementwise kernels (issue 17): the packed training step and decode forwards with the
kernels on vs off in one process, and per-kernel microbenchmarks.

For LLaDA-8B and SDAR-8B (random bf16 weights at the released shapes, benchmarks/configs/):

- the packed training step of `models_bench.py` (8 sequences, 4259 real tokens; varlen for
  LLaDA, flex for SDAR; naive log-prob head, as the `packed_*` rows of docs/benchmarks.md), timed
  with `model.kernels = KernelConfig(fused=True)` and `KernelConfig(fused=False)` alternately,
  with real-token MFU against the datasheet bf16 peak and against a measured 8192^3 matmul;
- (full run) the same step with the fused log-prob head;
- one KV-cached decode forward (batch 64; SDAR: block of 4 after 512 cached tokens; LLaDA: 32
  query tokens after 512 cached), no grad, on vs off;
- the relative difference of the final hidden states with kernels on vs off (a sanity figure);
- microbenchmarks of each kernel vs its plain path at the 8B shapes (4259 tokens): residual add
  + RMSNorm (H 4096), q/k head norm + RoPE (32 heads x 128, SDAR numerics), RoPE alone (LLaDA's
  float32 rotation), SwiGLU (12288), forward and forward+backward.

    python benchmarks/kernels_bench.py --quick    # H200, under ~4 minutes
    python benchmarks/kernels_bench.py            # more iterations + the fused-head step
    uv run python benchmarks/kernels_bench.py --tiny   # CPU smoke run (plain path only)

Figures are printed (JSON to $OUT/kernels_bench.json when $OUT is set, or --json PATH); nothing
is asserted on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "packages" / "dllm-models" / "src"))

import models_bench as mb  # noqa: E402

from dllm_models.kernels import HAS_TRITON  # noqa: E402
from dllm_models.layers import PLAIN, KernelConfig, RMSNorm, rope_cos_sin, rotate_heads, swiglu  # noqa: E402

FUSED = KernelConfig(fused=True)


def timed_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    mb.sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mb.sync(device)
    return (time.perf_counter() - t0) / iters * 1e3


def step_rows(name: str, model: nn.Module, args: argparse.Namespace, device: torch.device, mm: float) -> list[dict[str, Any]]:
    lengths = [max(1, n // 16) for n in mb.LENGTHS] if args.tiny else mb.LENGTHS
    pad_to = 64 if args.tiny else 1024
    vocab = int(mb.output_head(model).weight.shape[0])  # type: ignore[arg-type]
    batch = mb.make_batch(lengths, pad_to, min(vocab, 100_000), device)
    fns = mb.step_fns(model, batch, device, lengths)
    wanted = [k for k in fns if k.startswith("packed_") and not k.endswith("ckpt") and k != "packed_sdpa"]
    best = [k for k in wanted if ("flex" in k) == (getattr(model, "block_length", None) is not None) or device.type != "cuda"]
    if args.quick:
        best = [k for k in best if not k.endswith("fused")]
    rows = []
    for variant in best:
        fn, pairs = fns[variant]
        f = mb.flops(model, lengths, pairs)
        times: dict[str, float] = {}
        for label, cfg in (("off", PLAIN), ("on", FUSED), ("off", PLAIN), ("on", FUSED)):
            model.kernels = cfg  # type: ignore[assignment]
            try:
                ms = timed_ms(fn, device, args.warmup, args.iters)
            except Exception as err:  # noqa: BLE001 - report and go on
                rows.append({"model": name, "variant": f"{variant}[{label}]", "error": f"{type(err).__name__}: {err}"[:300]})
                break
            times[label] = min(times.get(label, float("inf")), ms)  # best of two alternating rounds
        for label, ms in times.items():
            rows.append({
                "model": name, "variant": f"{variant} kernels={label}", "ms": round(ms, 2),
                "mfu": round(f / (ms / 1e3) / mb.PEAK_BF16, 3) if device.type == "cuda" else None,
                "mfu_vs_matmul": round(f / (ms / 1e3) / mm, 3) if mm else None,
            })
        if len(times) == 2:
            rows.append({"model": name, "variant": f"{variant} speedup", "ratio": round(times["off"] / times["on"], 3)})
    return rows


def decode_rows(name: str, model: nn.Module, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    block = getattr(model, "block_length", None)
    b, ctx, q = (4, 16, 4) if args.tiny else (64, 512, block or 32)
    vocab = min(int(mb.output_head(model).weight.shape[0]), 100_000)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (b, ctx + q), generator=g).to(device)
    pos = torch.arange(ctx + q, device=device)[None].expand(b, -1)
    model.eval()
    model.attention_backend = "sdpa"  # type: ignore[assignment]
    rows = []
    with torch.no_grad():
        cache = model(ids[:, :ctx], position_ids=pos[:, :ctx], use_cache=True).past_key_values
        times = {}
        for label, cfg in (("off", PLAIN), ("on", FUSED)):
            model.kernels = cfg  # type: ignore[assignment]
            times[label] = timed_ms(
                lambda: model(ids[:, ctx:], position_ids=pos[:, ctx:], past_key_values=cache), device,
                args.warmup, args.iters * 2,
            )
            rows.append({"model": name, "variant": f"decode b{b} q{q} cache{ctx} kernels={label}", "ms": round(times[label], 2)})
        rows.append({"model": name, "variant": "decode speedup", "ratio": round(times["off"] / times["on"], 3)})
        # sanity: the same hidden states either way (bf16 rounding differences only)
        hs = []
        for cfg in (PLAIN, FUSED):
            model.kernels = cfg  # type: ignore[assignment]
            hs.append(model.final_hidden(ids[:8, :256], position_ids=pos[:8, :256]).double())  # type: ignore[operator]
        rows.append({"model": name, "variant": "final hidden rel diff on vs off",
                     "ratio": float((hs[0] - hs[1]).norm() / hs[0].norm())})
    model.train()
    return rows


def micro_rows(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    t, h, heads, hd, inter = (64, 64, 4, 16, 128) if args.tiny else (4259, 4096, 32, 128, 12288)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(1, t, h, device=device, generator=g).to(dtype).requires_grad_(True)
    r = torch.randn(1, t, h, device=device, generator=g).to(dtype).requires_grad_(True)
    q = torch.randn(1, t, heads, hd, device=device, generator=g).to(dtype).requires_grad_(True)
    gate = torch.randn(t, inter, device=device, generator=g).to(dtype).requires_grad_(True)
    up = torch.randn(t, inter, device=device, generator=g).to(dtype).requires_grad_(True)
    norm = RMSNorm(h, 1e-6).to(device=device, dtype=dtype)
    qnorm = RMSNorm(hd, 1e-6, scale_in_fp32=True).to(device=device, dtype=dtype)
    cos, sin = rope_cos_sin(torch.arange(t, device=device)[None], hd, 1e6)
    cases: dict[str, tuple[Callable[[KernelConfig], Any], float]] = {
        # (op, bytes a fused forward must move) -> GB/s figure for the fused path
        "add_rmsnorm H4096": (lambda k: norm.add_forward(x, r, k), 4 * x.numel() * x.element_size()),
        "qk_norm_rope 32x128 (SDAR)": (
            lambda k: rotate_heads(q, cos, sin, norm=qnorm, full_precision=False, kernels=k), 2 * q.numel() * q.element_size()),
        "rope 32x128 fp32-rotation (LLaDA)": (
            lambda k: rotate_heads(q, cos, sin, norm=None, full_precision=True, kernels=k), 2 * q.numel() * q.element_size()),
        "swiglu 12288": (lambda k: swiglu(gate, up, k), 3 * gate.numel() * gate.element_size()),
    }
    rows = []
    for label, (op, nbytes) in cases.items():
        for mode in ("fwd", "fwd+bwd"):
            res: dict[str, float] = {}
            for kname, cfg in (("plain", PLAIN), ("fused", FUSED)):
                if kname == "fused" and not (HAS_TRITON and device.type == "cuda"):
                    continue

                def run(cfg: KernelConfig = cfg) -> None:
                    if mode == "fwd":
                        with torch.no_grad():
                            op(cfg)
                        return
                    out = op(cfg)
                    outs = out if isinstance(out, tuple) else (out,)
                    torch.autograd.backward(list(outs), [torch.ones_like(o) for o in outs])

                res[kname] = timed_ms(run, device, 3, args.iters * 4)
            row: dict[str, Any] = {"model": "micro", "variant": f"{label} {mode}",
                                   "plain_ms": round(res["plain"], 3)}
            if "fused" in res:
                row["fused_ms"] = round(res["fused"], 3)
                row["ratio"] = round(res["plain"] / res["fused"], 2)
                if mode == "fwd":
                    row["fused_GBps"] = round(nbytes / res["fused"] / 1e6, 0)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations, no fused-head step (< ~4 min on an H200)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--models", default="LLaDA-8B,SDAR-8B")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--json", default=None, help="JSON output path (default $OUT/kernels_bench.json)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if not args.tiny and device.type != "cuda":
        sys.exit("real shapes need a CUDA GPU; pass --tiny for the CPU smoke run")
    args.iters = args.iters or (3 if args.quick or device.type != "cuda" else 6)
    args.warmup = args.warmup if args.warmup is not None else (1 if device.type != "cuda" else 2)
    t0 = time.perf_counter()
    mm = mb.matmul_peak(device)
    rows = micro_rows(args, device, dtype)
    for name in args.models.split(","):
        model = mb.build(name, args.tiny, device, dtype)
        rows += step_rows(name, model, args, device, mm)
        rows += decode_rows(name, model, args, device)
        del model
        mb.reset_peak(device)
    report = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": str(dtype), "quick": args.quick, "tiny": args.tiny,
        "matmul_tflops": round(mm / 1e12, 1), "wall_s": round(time.perf_counter() - t0, 1), "rows": rows,
    }
    cols = ["model", "variant", "ms", "mfu", "mfu_vs_matmul", "plain_ms", "fused_ms", "ratio", "fused_GBps", "error"]
    print(f"device {report['device']}  torch {report['torch']}  matmul {report['matmul_tflops']} TFLOP/s")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols))
    print(f"wall {report['wall_s']} s")
    out = args.json or (os.path.join(os.environ["OUT"], "kernels_bench.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

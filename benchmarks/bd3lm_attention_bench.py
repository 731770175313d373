"""BD3LM attention of one packed training row: the Triton kernel vs flex vs sdpa, against the FLOP floor.

One row of the shared-clean layout [x_0 ; x_t^1 ; ... ; x_t^k] per sequence
(`dllm_models.bd3lm_mask(copies=...)`), at SDAR-8B's attention shape by default (32 query heads,
8 KV heads, head dim 128, block 4) and 16,384 positions (one sequence of 2048 prompt + response
tokens and 7 noisy copies), random bf16 q/k/v. Per backend (`attend(..., backend=...)`:
`bd3lm_kernel`, `flex`, `sdpa`) it times the forward alone and forward + backward (CUDA events,
median of --iters after --warmup), and prints:

- visible pairs P (exactly counted from the mask's intervals) and the pairs the kernel's
  forward tiles cover;
- required FLOPs: forward 4 P D Hq (q k^T and p v), backward 2.5x that (FlashAttention's count:
  q k^T recomputed, dV, dP, dQ, dK), so forward + backward 14 P D Hq;
- the floor: required FLOPs at --peak-tflops (989: the H200's dense bf16 datasheet figure), and
  floor / measured (1.0 = at the floor).

    python benchmarks/bd3lm_attention_bench.py                               # SDAR-8B, 16k positions
    python benchmarks/bd3lm_attention_bench.py --seq-lens 1024,1024 --copies 7,7
    python benchmarks/bd3lm_attention_bench.py --block 32 --heads 16 --kv-heads 4  # a LLaDA2-like block
    python benchmarks/bd3lm_attention_bench.py --backends bd3lm_kernel --iters 3   # the kernel only
    TRITON_INTERPRET=1 uv run python benchmarks/bd3lm_attention_bench.py --tiny     # CPU smoke run

Figures are printed (and written as JSON to --json PATH, or $OUT/bd3lm_attention_bench.json
when $OUT is set); nothing is asserted on time. Needs a CUDA GPU (but for --tiny).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
for _src in [str(p) for p in sorted(REPO.glob("packages/*/src"))]:
    if _src not in sys.path:
        sys.path.insert(0, _src)

from dllm_models.attention import attend, bd3lm_mask  # noqa: E402
from dllm_models.kernels.bd3lm_attention import GPU_TILING, INTERPRETER_TILING  # noqa: E402
from dllm_models.kernels.bd3lm_schedule import build_schedule, intervals, position_ids, visited_pairs  # noqa: E402


def timed_ms(fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Median milliseconds of `fn` (CUDA events; wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if not torch.cuda.is_available():
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="2048", help="comma-separated lengths of the packed sequences")
    ap.add_argument("--copies", default="7", help="noisy copies per sequence (comma-separated)")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backends", default="bd3lm_kernel,flex,sdpa")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 datasheet)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true",
                    help="CPU smoke run of the script (2 x 48 tokens, 4/2 heads x 16; the kernel runs under "
                         "TRITON_INTERPRET=1, else falls back to sdpa; flex has no CPU backward)")
    args = ap.parse_args()
    if args.tiny:
        args.seq_lens, args.copies, args.heads, args.kv_heads, args.head_dim = "48,40", "2,3", 4, 2, 16
        args.warmup, args.iters = 0, 1
    elif not torch.cuda.is_available():
        raise SystemExit("bd3lm_attention_bench needs a CUDA GPU (or --tiny)")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    lengths = [int(x) for x in args.seq_lens.split(",")]
    copies = [int(x) for x in args.copies.split(",")]
    mask = bd3lm_mask(lengths, args.block, copies=copies, device=dev)
    n = int(mask.cu_seqlens[-1])  # type: ignore[index]
    ids = position_ids(mask, n, dev)
    lo1, hi1, lo2, hi2 = intervals(ids)
    pairs = int((hi1 - lo1).sum() + (hi2 - lo2).sum())
    t = (GPU_TILING if dev.type == "cuda" else INTERPRETER_TILING).forward  # the tiles the kernel will use
    tiles = visited_pairs(build_schedule(ids, t.block_m, t.block_n, padded_keys=False), t.block_m, t.block_n)
    hq, d = args.heads, args.head_dim
    fwd_flops = 4.0 * pairs * d * hq
    g = torch.Generator(device=dev).manual_seed(0)
    q0 = torch.randn(1, n, hq, d, generator=g, device=dev, dtype=dtype).transpose(1, 2)
    k0, v0 = (torch.randn(1, args.kv_heads, n, d, generator=g, device=dev, dtype=dtype) for _ in range(2))
    go = torch.randn(1, hq, n, d, generator=g, device=dev, dtype=dtype)
    print(f"{n} positions ({lengths} x {copies} copies, block {args.block}), heads {hq}/{args.kv_heads} x {d}: "
          f"visible pairs {pairs:,} ({pairs / n / n:.1%} of N^2), kernel tiles cover {tiles / pairs:.2f}x them")
    rows: list[dict[str, Any]] = []
    for backend in args.backends.split(","):
        q, k, v = (x.detach().clone().requires_grad_() for x in (q0, k0, v0))

        def forward(backend: str = backend) -> None:
            with torch.no_grad():
                attend(q, k, v, mask, backend=backend)

        def train(backend: str = backend) -> None:
            out = attend(q, k, v, mask, backend=backend)
            torch.autograd.grad(out, (q, k, v), go)

        row: dict[str, Any] = {"backend": backend}
        for name, fn, flops in (("fwd", forward, fwd_flops), ("fwd_bwd", train, 3.5 * fwd_flops)):
            try:
                ms = timed_ms(fn, args.warmup, args.iters)
            except Exception as err:  # noqa: BLE001 - a backend that cannot run this shape reports why
                row[name] = f"failed: {type(err).__name__}: {str(err)[:200]}"
                continue
            floor_ms = flops / (args.peak_tflops * 1e12) * 1e3
            row[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "floor_ms": round(floor_ms, 3),
                         "floor_over_measured": round(floor_ms / ms, 3)}
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row))
    report = {"positions": n, "lengths": lengths, "copies": copies, "block": args.block, "heads": hq,
              "kv_heads": args.kv_heads, "head_dim": d, "visible_pairs": pairs, "kernel_tile_pairs": tiles,
              "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "rows": rows}
    path = args.json or (os.path.join(os.environ["OUT"], "bd3lm_attention_bench.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
    print(f"{'backend':<14}{'fwd ms':>10}{'fwd+bwd ms':>12}{'floor ms':>10}{'floor/meas':>12}")
    for row in rows:
        fb = row.get("fwd_bwd")
        f = row.get("fwd")
        fms = f["ms"] if isinstance(f, dict) else float("nan")
        if isinstance(fb, dict):
            print(f"{row['backend']:<14}{fms:>10.3f}{fb['ms']:>12.3f}{fb['floor_ms']:>10.3f}{fb['floor_over_measured']:>12.3f}")
        else:
            print(f"{row['backend']:<14}{fms:>10.3f}  {fb}")


if __name__ == "__main__":
    main()

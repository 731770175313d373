"""BD3LM attention of one packed training row: the Triton kernel vs flex vs sdpa, against the FLOP floor.

One row of the shared-clean layout [x_0 ; x_t^1 ; ... ; x_t^k] per sequence
(`dllm_models.bd3lm_mask(copies=...)`), at SDAR-8B's attention shape by default (32 query heads,
8 KV heads, head dim 128, block 4) and 16,384 positions (one sequence of 2048 prompt + response
tokens and 7 noisy copies), random bf16 q/k/v. Per backend (`attend(..., backend=...)`:
`bd3lm_kernel`, `flex`, `sdpa`) it times the forward alone and forward + backward (CUDA events,
median of --iters after --warmup). The kernel is timed once per backward variant of
`--bwd-variants` (`BD3LMKernelOptions.backward`: split, one_launch, chunked, fused) and, for a
sweep, per tile of `--fwd-tiles` / `--dkdv-tiles` / `--dq-tiles` ('MxNwWsS': queries x keys, warps,
stages) and per `--chunks`; each kernel row also reports its largest difference from the first non-kernel
backend's output and gradients (flex on the GPU, sdpa on the CPU). It prints:

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
    python benchmarks/bd3lm_attention_bench.py --backends bd3lm_kernel,flex --bwd-variants split,one_launch,chunked,fused
    python benchmarks/bd3lm_attention_bench.py --bwd-variants chunked --dkdv-tiles 64x64w8s3,64x128w8s3 --chunks 8,16
    TRITON_INTERPRET=1 uv run python benchmarks/bd3lm_attention_bench.py --tiny --bwd-variants split,fused

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
from dllm_models.kernels.bd3lm_attention import (  # noqa: E402
    GPU_TILING,
    INTERPRETER_TILING,
    BD3LMKernelOptions,
    Tile,
    Tiling,
    bd3lm_attend,
)
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


def kernel_options(args: argparse.Namespace, base: Tiling) -> list[tuple[str, BD3LMKernelOptions]]:
    """(label, options) per backward variant x forward tile x dK/dV tile x dQ tile x chunk of the command line."""
    def tiles(text: str | None, default: Tile) -> list[Tile]:
        return [Tile.parse(t) for t in text.split(",")] if text else [default]

    def name(tile: Tile) -> str:
        return f"{tile.block_m}x{tile.block_n}w{tile.warps}s{tile.stages}"

    chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [BD3LMKernelOptions().dkdv_chunk]
    out = []
    for variant in args.bwd_variants.split(","):
        for fwd in tiles(args.fwd_tiles, base.forward):
            for kv in tiles(args.dkdv_tiles, base.dkdv):
                for dq in tiles(args.dq_tiles, base.dq):
                    for chunk in chunks if variant in ("chunked", "fused") else chunks[:1]:
                        opts = BD3LMKernelOptions(backward=variant, tiling=Tiling(fwd, kv, dq), dkdv_chunk=chunk)
                        label = f"kernel:{variant}"
                        label += f" fwd={name(fwd)}" if args.fwd_tiles else ""
                        label += f" kv={name(kv)}" if args.dkdv_tiles else ""
                        label += f" q={name(dq)}" if args.dq_tiles and variant != "fused" else ""
                        label += f" c={chunk}" if args.chunks and variant in ("chunked", "fused") else ""
                        out.append((label, opts))
    return list(dict((label, (label, o)) for label, o in out).values())  # fused ignores the dQ tile


def max_errors(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    """Largest absolute difference per tensor (out, dq, dk, dv)."""
    names = ("out", "dq", "dk", "dv")
    return {name: float(f"{(a.float() - b.float()).abs().max().item():.3g}") for name, a, b in zip(names, got, ref)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="2048", help="comma-separated lengths of the packed sequences")
    ap.add_argument("--copies", default="7", help="noisy copies per sequence (comma-separated)")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backends", default="bd3lm_kernel,flex,sdpa",
                    help="bd3lm_kernel (once per --bwd-variants entry), flex, sdpa")
    ap.add_argument("--bwd-variants", default="chunked", help="comma-separated backward variants of the kernel "
                    "(split, one_launch, chunked, fused)")
    ap.add_argument("--fwd-tiles", default=None, help="comma-separated forward tiles 'MxNwWsS' to sweep")
    ap.add_argument("--dkdv-tiles", default=None, help="comma-separated dK/dV tiles 'MxNwWsS' to sweep")
    ap.add_argument("--dq-tiles", default=None, help="comma-separated dQ tiles 'MxNwWsS' to sweep")
    ap.add_argument("--chunks", default=None, help="comma-separated query tiles per dK/dV program (chunked, fused)")
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
    base = GPU_TILING if dev.type == "cuda" else INTERPRETER_TILING
    t = Tile.parse(args.fwd_tiles.split(",")[0]) if args.fwd_tiles else base.forward  # the kernel's forward tile
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
    runs: list[tuple[str, str, BD3LMKernelOptions | None]] = []
    for backend in args.backends.split(","):
        if backend == "bd3lm_kernel":
            runs += [(label, backend, opts) for label, opts in kernel_options(args, base)]
        else:
            runs.append((backend, backend, None))
    ref: list[torch.Tensor] | None = None
    for label, backend, opts in sorted(runs, key=lambda r: r[2] is not None):  # the reference backends first
        q, k, v = (x.detach().clone().requires_grad_() for x in (q0, k0, v0))

        def call(backend: str = backend, opts: BD3LMKernelOptions | None = opts) -> torch.Tensor:
            return bd3lm_attend(q, k, v, mask, options=opts) if opts is not None else attend(q, k, v, mask,
                                                                                               backend=backend)

        def forward() -> None:
            with torch.no_grad():
                call()

        def train() -> list[torch.Tensor]:
            out = call()
            return [out, *torch.autograd.grad(out, (q, k, v), go)]

        row: dict[str, Any] = {"backend": label}
        try:
            got = [t.detach() for t in train()]
            if ref is None and opts is None and not (backend == "flex" and dev.type == "cpu"):
                ref = got
            elif ref is not None and opts is not None:
                row["max_abs_diff_vs_reference"] = max_errors(got, ref)
            del got
        except Exception as err:  # noqa: BLE001 - a backend that cannot run this shape reports why
            row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        for name, fn, flops in (("fwd", forward, fwd_flops), ("fwd_bwd", train, 3.5 * fwd_flops)):
            if "error" in row:
                break
            try:
                ms = timed_ms(fn, args.warmup, args.iters)
            except Exception as err:  # noqa: BLE001
                row[name] = f"failed: {type(err).__name__}: {str(err)[:200]}"
                continue
            floor_ms = flops / (args.peak_tflops * 1e12) * 1e3
            row[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "floor_ms": round(floor_ms, 3),
                         "floor_over_measured": round(floor_ms / ms, 3)}
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"positions": n, "lengths": lengths, "copies": copies, "block": args.block, "heads": hq,
              "kv_heads": args.kv_heads, "head_dim": d, "visible_pairs": pairs, "kernel_tile_pairs": tiles,
              "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "rows": rows}
    path = args.json or (os.path.join(os.environ["OUT"], "bd3lm_attention_bench.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
    width = max(14, *(len(r["backend"]) + 2 for r in rows))
    print(f"{'backend':<{width}}{'fwd ms':>10}{'fwd+bwd ms':>12}{'floor ms':>10}{'floor/meas':>12}"
          f"{'max diff vs ref':>17}")
    for row in rows:
        fb = row.get("fwd_bwd")
        f = row.get("fwd")
        fms = f["ms"] if isinstance(f, dict) else float("nan")
        if isinstance(fb, dict):
            diff = row.get("max_abs_diff_vs_reference")
            worst = f"{max(diff.values()):.3g}" if diff else "-"
            print(f"{row['backend']:<{width}}{fms:>10.3f}{fb['ms']:>12.3f}{fb['floor_ms']:>10.3f}"
                  f"{fb['floor_over_measured']:>12.3f}{worst:>17}")
        else:
            print(f"{row['backend']:<{width}}{fms:>10.3f}  {fb or row.get('error')}")


if __name__ == "__main__":
    main()

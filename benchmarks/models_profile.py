"""Where a packed training step's GPU time goes: the top CUDA kernels of one fwd + bwd.

Same workload as `models_bench.py` (8 sequences, 4259 real tokens, random bf16 weights at the
released shape), variant `packed_flex` (SDAR) or `packed_varlen` (LLaDA), under torch.profiler.

    python benchmarks/models_profile.py --model SDAR-8B     # H200, ~1.5 min
    uv run python benchmarks/models_profile.py --tiny       # CPU smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models_bench import LENGTHS, build, make_batch, step_fns  # noqa: E402

from dllm_models.logprob import output_head  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="SDAR-8B", choices=["SDAR-8B", "LLaDA-8B"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = [max(1, n // 16) for n in LENGTHS] if args.tiny else LENGTHS
    model = build(args.model, args.tiny, device, dtype)
    vocab = int(output_head(model).weight.shape[0])  # type: ignore[arg-type]
    batch = make_batch(lengths, 64 if args.tiny else 1024, min(vocab, 100_000), device)
    fns = step_fns(model, batch, device, lengths)
    name = "packed_flex" if "packed_flex" in fns else next(k for k in fns if k.startswith("packed_"))
    fn = fns[name][0]
    for _ in range(3):
        fn()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(2):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"{args.model} {name}: 2 steps")
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()

"""The weights' identity in `dare eval`'s manifests (issue 23, item 3): the old per-benchmark SHA-256
(`dllm_eval.manifest.weights_hash`, every tensor copied to the CPU) against the new per-model
fingerprint (`weights_fingerprint`, integer sums on the tensors' own device), on a random model of
about 1 GiB (float32 by default).

    uv run python benchmarks/fingerprint_bench.py                       # CPU, ~1 GiB, 9 benchmarks
    uv run python benchmarks/fingerprint_bench.py --device cuda --dtype bfloat16 --gib 16

"before" is what `dare eval --benchmarks <all 9>` paid (one SHA-256 per benchmark); "after" is one
fingerprint per model. Figures are printed; nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import time

import torch

from dllm_eval.manifest import weights_fingerprint, weights_hash


def random_model(gib: float, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Square 4096 x 4096 linear layers (bias-free) adding up to about `gib` GiB."""
    per_layer = 4096 * 4096 * torch.finfo(dtype).bits // 8
    layers = max(1, round(gib * 2**30 / per_layer))
    model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096, bias=False, device="meta") for _ in range(layers)))
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)
    return model


def _timed(fn: object, model: torch.nn.Module) -> tuple[float, str | None]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(model)  # type: ignore[operator]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--benchmarks", type=int, default=9, help="benchmarks of one dare eval call")
    args = parser.parse_args()
    model = random_model(args.gib, getattr(torch, args.dtype), args.device)
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    sha_s, _ = _timed(weights_hash, model)
    fp_s, fp = _timed(weights_fingerprint, model)
    again_s, fp2 = _timed(weights_fingerprint, model)
    assert fp == fp2
    print(f"model: {size:.2f} GiB of {args.dtype} on {args.device}, torch threads {torch.get_num_threads()}")
    print(f"sha256 (old, per benchmark): {sha_s:.2f} s; x {args.benchmarks} benchmarks = {sha_s * args.benchmarks:.1f} s")
    print(f"fingerprint (new, per model): {fp_s:.2f} s (again: {again_s:.2f} s)")
    print(f"dare eval of {args.benchmarks} benchmarks: {sha_s * args.benchmarks:.1f} s -> {fp_s:.2f} s of hashing")


if __name__ == "__main__":
    main()

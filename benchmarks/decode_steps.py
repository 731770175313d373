"""Per-step time of the product's decoders, CUDA graphs and the fused sampling kernel on and off, in one process.

What issue #17 measures for decoding, taken from whole `dllm_rollout.decode` calls (the code that
`dare train` and `dare eval` run, sampling included), never from a loop written here:

- SDAR-8B, block 4, exact KV cache (`cache="prefix"`): the decode's wall time divided by its
  forwards (blocks x (steps + 1 store pass)), and the same without the prompt's prefill (the
  one full forward over the prompt blocks, timed alone: it is not a cached forward, as the
  LLaDA figure leaves out its block-start full forwards).
- LLaDA-8B, Fast-dLLM dual cache, block 32: the decode's wall time minus its block-start full
  forwards (timed alone), divided by the dual steps.

Random bf16 weights at the released shapes (benchmarks/configs), batch 64, 256-token prompts,
256 new tokens, T = 1 with top-k 50 (SDAR) and T = 0.6 (LLaDA), as in rl_iteration_bench.

    python benchmarks/decode_steps.py                      # H200, ~2 min
    uv run python benchmarks/decode_steps.py --tiny        # CPU smoke run (graphs are CUDA-only)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rollout_bench import _model  # noqa: E402

from dllm_rollout import SamplingConfig, SpeedConfig, decode  # noqa: E402
from dllm_rollout.block import grid_canvas  # noqa: E402
from dllm_rollout.head import block_forward  # noqa: E402


def _wall(fn: Callable[[], Any], device: str) -> float:
    """Seconds of one call of `fn`, synchronised."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


VARIANTS = (("graphs on, fused sampling", True, True), ("graphs on, unfused sampling", True, False),
            ("graphs off, fused sampling", False, True))
"""(name, CUDA graphs, fused sampling kernel): the product's default first."""


def _decode_both(model: Any, ids: torch.Tensor, mask: torch.Tensor, cfg: SamplingConfig,
                 device: str) -> dict[str, float]:
    """Decode wall seconds of each variant (each after a warm-up decode). Graphs on and off must give
    the same tokens; the unfused sampling path gives the same tokens up to float32 rounding of
    its CDF (a rounding flip changes the rest of that row's decode), reported as a fraction."""
    seeds = torch.arange(ids.shape[0])
    out: dict[str, float] = {}
    tokens = {}
    for name, graphs, fused in VARIANTS:
        run = dataclasses.replace(cfg, speed=SpeedConfig(cuda_graphs=graphs, fused_sampling=fused))
        decode(model, ids, mask, seeds, run)  # warm-up: kernels, autotune, allocator
        holder: dict[str, Any] = {}
        out[name] = _wall(lambda: holder.update(batch=decode(model, ids, mask, seeds, run)), device)
        tokens[name] = holder["batch"].response_ids
    first, unfused, eager = (tokens[name] for name, _, _ in VARIANTS)
    if not torch.equal(first, eager):
        raise AssertionError("graphs on and off decoded different tokens")
    out["same tokens fused vs unfused (fraction)"] = float((first == unfused).float().mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated: sdar, llada")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, p, r = (4, 16, 16) if args.tiny else (args.batch, 256, 256)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500 if args.tiny else 100_000, (b, p), generator=gen).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    rows: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                            "batch": b, "prompt": p, "new_tokens": r}
    skip = set(args.skip.split(","))
    if "sdar" not in skip:
        sdar = _model("SDAR-8B-Chat", args.tiny, device, dtype, block_size=4)
        cfg = SamplingConfig(max_new_tokens=r, block_length=4, steps=4, block_diffusion=True, temperature=1.0,
                             top_k=50, stop_at_eos=False, cache="prefix")
        walls = _decode_both(sdar, ids, mask, cfg, device)
        traits = sdar.traits  # type: ignore[union-attr]
        canvas, attn, pos, r0, _ = grid_canvas(ids, mask, 4, r, int(traits.mask_token_id), int(traits.pad_token_id))
        with torch.no_grad():  # the decoder's prefill: keys/values of the prompt blocks, no head
            prefill = min(_wall(lambda: block_forward(sdar, canvas[:, :r0], 0, 0, attention_mask=attn[:, :r0],
                                                      position_ids=pos[:, :r0], use_cache=True), device)
                          for _ in range(3))
        forwards = (r // 4) * (4 + 1)
        rows["sdar"] = {**walls, "forwards": forwards, "prefill s": prefill,
                        **{f"ms per forward, {k}": 1e3 * v / forwards
                           for k, v in walls.items() if not k.startswith("same tokens")},
                        **{f"ms per cached forward (no prefill), {k}": 1e3 * (v - prefill) / forwards
                           for k, v in walls.items() if not k.startswith("same tokens")}}
        del sdar
        if device == "cuda":
            torch.cuda.empty_cache()
    if "llada" not in skip:
        llada = _model("LLaDA-8B-Instruct", args.tiny, device, dtype)
        bl = 32 if not args.tiny else 8
        cfg = SamplingConfig(max_new_tokens=r, block_length=bl, steps=r // 2, temperature=0.6, cache="dual")
        walls = _decode_both(llada, ids, mask, cfg, device)
        mask_id = int(llada.traits.mask_token_id)  # type: ignore[union-attr]
        canvas = torch.cat([ids, torch.full((b, r), mask_id, device=device)], 1)
        pos = torch.arange(canvas.shape[1], device=device)[None].expand(b, -1)
        with torch.no_grad():
            full = min(_wall(lambda: block_forward(llada, canvas, p, p + bl, position_ids=pos, use_cache=True), device)
                       for _ in range(3))
        blocks, spb = r // bl, (r // 2) // (r // bl)
        dual = blocks * (spb - 1)
        rows["llada"] = {**walls, "full forward s": full, "block starts": blocks, "dual steps": dual,
                         **{f"ms per dual step, {k}": 1e3 * (v - blocks * full) / dual
                            for k, v in walls.items() if not k.startswith("same tokens")}}
    print(json.dumps(rows, indent=1))
    out = os.environ.get("OUT")
    if out:
        (Path(out) / "decode_steps.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

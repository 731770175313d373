"""Where a rollout step's time goes: one cached SDAR step and one no-cache LLaDA step.

Random weights at the released shapes (benchmarks/configs), bf16, batch 64, 256-token prompts.
For each model it prints CUDA-event timings of the parts of a step (the forward alone, the
forward's LM head, the proposal/confidence/selection) and a torch.profiler table of the top CUDA
kernels of a whole decoding call, then a summary table (printed last).

    python benchmarks/rollout_profile.py          # H200, ~2 min
    uv run python benchmarks/rollout_profile.py --tiny   # CPU smoke run
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rollout_bench import _model  # noqa: E402

from dllm_rollout import SamplingConfig, SpeedConfig, decode  # noqa: E402
from dllm_rollout.block import grid_canvas  # noqa: E402
from dllm_rollout.noise import RowNoise  # noqa: E402
from dllm_rollout.sampling import propose_scored, select  # noqa: E402


def _time(fn: Callable[[], Any], device: str, reps: int = 3) -> float:
    """Median milliseconds of `fn` (CUDA events on GPU), after one warm-up."""
    fn()
    out = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t0))
    return sorted(out)[len(out) // 2]


def _profile(fn: Callable[[], Any], device: str, label: str, rows: int = 18) -> float:
    """Run `fn` under torch.profiler, print the top kernels; returns wall ms."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = 1e3 * (time.perf_counter() - t0)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(f"\n=== {label}: wall {wall:.1f} ms ===")
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))
    return wall


def _parts(model: Any, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any,
           device: str, out: dict[str, float], tag: str) -> None:
    """Time the forward, the hidden-only forward, the head on the block and the sampling math."""
    from dllm_models.logprob import final_hidden, output_head

    kw: dict[str, Any] = {"attention_mask": attn, "position_ids": pos}
    if cache is not None:
        kw["past_key_values"] = cache
    with torch.no_grad():
        out[f"{tag} forward (logits, all queries)"] = _time(lambda: model(ids, **kw), device)
        out[f"{tag} forward to hidden"] = _time(lambda: final_hidden(model, ids, **kw), device)
        h = final_hidden(model, ids, **kw)
        head = output_head(model)
        blk = h[:, -min(32, h.shape[1]):] if cache is None else h
        if cache is None:
            from dllm_rollout.head import block_forward

            n = ids.shape[1]
            out[f"{tag} forward, head on last 32 columns"] = _time(
                lambda: block_forward(model, ids, n - 32, n, **kw), device)
        out[f"{tag} head on block"] = _time(lambda: head(blk), device)
        logits = head(blk)
        b = logits.shape[0]
        active = torch.ones(b, dtype=torch.bool, device=logits.device)
        still = torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device)
        k = torch.ones(b, dtype=torch.long, device=logits.device)
        noise = RowNoise(torch.arange(b), logits.device)

        for remasking, temperature, top_k in (("low_confidence", 0.0, None), ("low_confidence", 0.6, None),
                                              ("maskgit_plus", 1.0, 50)):
            for fused in (True, False):
                def sample() -> None:
                    _, conf, _ = propose_scored(logits, remasking=remasking, temperature=temperature, top_k=top_k,
                                                top_p=None, noise=noise, active=active, mask_id=0, fused=fused)
                    select(conf, still, k)

                kind = "fused" if fused else "unfused"
                out[f"{tag} propose_scored+select ({remasking}, T={temperature}, top-k {top_k}, {kind})"] = _time(
                    sample, device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--skip-llada", action="store_true")
    ap.add_argument("--skip-sdar", action="store_true")
    args = ap.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, p = (4, 32) if args.tiny else (64, 256)
    gen = torch.Generator().manual_seed(0)
    times: dict[str, float] = {}

    ids = torch.randint(0, 100_000 if not args.tiny else 500, (b, p), generator=gen).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    seeds = torch.arange(b)
    if not args.skip_sdar:
        _sdar(args, b, ids, mask, seeds, device, dtype, times)
    _llada(args, b, p, ids, mask, seeds, device, dtype, times)
    print(f"\ndevice={device} batch={b} prompt={p}")
    for k, v in times.items():
        print(f"{k:60s} {v:10.2f} ms")
    out = os.environ.get("OUT")
    if out:
        (Path(out) / "rollout_profile.json").write_text(json.dumps(times, indent=2))


def _sdar(args: argparse.Namespace, b: int, ids: torch.Tensor, mask: torch.Tensor, seeds: torch.Tensor,
          device: str, dtype: torch.dtype, times: dict[str, float]) -> None:
    # ---- SDAR block 4, one cached step: block queries against the prompt's KV cache
    sdar = _model("SDAR-8B-Chat", args.tiny, device, dtype, block_size=4)
    canvas, attn, pos, r0, _ = grid_canvas(ids, mask, 4, 8, sdar.traits.mask_token_id, sdar.traits.pad_token_id)
    with torch.no_grad():
        cache = sdar(canvas[:, :r0], attention_mask=attn[:, :r0], position_ids=pos[:, :r0],
                     use_cache=True).past_key_values
    s, e = r0, r0 + 4
    _parts(sdar, canvas[:, s:e], attn[:, s:e], pos[:, s:e], cache, device, times, "sdar cached step:")
    # the decoder's cached step: static full-canvas cache, replayed as a CUDA graph
    from dllm_rollout.block import _CachedBlocks

    with torch.no_grad():
        cb = _CachedBlocks(sdar, canvas, attn, pos, r0, 4, SpeedConfig())
        cb.logits(s, e)  # first call on a new block: marks its columns, captures the graph
        times["sdar cached step: _CachedBlocks.logits (graph replay)"] = _time(lambda: cb.logits(s, e), device, reps=5)
        print(f"graph captured: {cb.step.graph is not None}, capture failed: {cb.step.failed}")
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            cb.logits(s, e)
        if device == "cuda":
            torch.cuda.synchronize()
        times["sdar cached step: host wall per graph step (10 in a row)"] = 1e3 * (time.perf_counter() - t0) / 10
        del cb
    cfg = SamplingConfig(max_new_tokens=8, block_length=4, steps=4, block_diffusion=True, cache="prefix",
                         stop_at_eos=False)
    decode(sdar, ids, mask, seeds, cfg)
    wall = _profile(lambda: decode(sdar, ids, mask, seeds, cfg), device,
                    "SDAR decode 2 blocks x 4 steps (prefix fill + 8 steps + 1 store)")
    times["sdar decode 2 blocks (8 steps+fill+store) wall"] = wall
    del sdar, cache
    if device == "cuda":
        torch.cuda.empty_cache()



def _llada(args: argparse.Namespace, b: int, p: int, ids: torch.Tensor, mask: torch.Tensor, seeds: torch.Tensor,
           device: str, dtype: torch.dtype, times: dict[str, float]) -> None:
    # ---- LLaDA no-cache: one step over the whole 512 canvas
    if not args.skip_llada:
        llada = _model("LLaDA-8B-Instruct", args.tiny, device, dtype)
        r = p
        full = torch.cat([ids, torch.full((b, r), 126336 if not args.tiny else 1, device=device)], 1)
        fa = torch.ones_like(full, dtype=torch.bool)
        fp = torch.arange(full.shape[1], device=device)[None].expand(b, -1)
        _parts(llada, full, fa, fp, None, device, times, "llada no-cache step:")
        lcfg = SamplingConfig(max_new_tokens=r, block_length=32, steps=r)
        from dllm_rollout.masked import decode_masked

        decode_masked(llada, ids, mask, seeds, lcfg, last_step=1)
        times["llada decode 2 steps wall"] = _profile(
            lambda: decode_masked(llada, ids, mask, seeds, lcfg, last_step=2), device, "LLaDA no-cache 2 steps")
        # Fast-dLLM dual cache, one block of 32 tokens in 16 steps (1 full forward + 15 dual steps)
        for temp in (0.0, 0.6):
            dcfg = SamplingConfig(max_new_tokens=32, block_length=32, steps=16, cache="dual", temperature=temp)
            decode(llada, ids, mask, seeds, dcfg)
            times[f"llada dual 1 block (16 steps) T={temp} wall"] = _profile(
                lambda: decode(llada, ids, mask, seeds, dcfg), device, f"LLaDA dual cache, 1 block, T={temp}")


if __name__ == "__main__":
    main()

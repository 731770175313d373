"""Rollout throughput: masked diffusion (LLaDA) caches/threshold and block diffusion (SDAR) KV cache.

Random weights at the released shapes (benchmarks/configs/<name>/config.json), bf16, batch 64,
256-token prompts + 256 new tokens. Each config is time-boxed: it decodes at most `--max-blocks`
blocks and extrapolates tokens/s to the full response (labelled "extrapolated"); a full run
decodes everything. `--tiny` builds 2-layer models and runs on CPU.

    uv run python benchmarks/rollout_bench.py            # H200, < 8 min
    uv run python benchmarks/rollout_bench.py --tiny     # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from dllm_models import empty_model
from dllm_rollout import SamplingConfig, decode

HERE = Path(__file__).resolve().parent


def _model(name: str, tiny: bool, device: str, dtype: torch.dtype, **overrides: Any) -> torch.nn.Module:
    raw = json.loads((HERE / "configs" / name / "config.json").read_text())
    raw.update(overrides)
    if tiny:
        if raw["model_type"] == "llada":
            raw.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=256)
        else:
            raw.update(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, intermediate_size=256)
    model = empty_model(raw, dtype=dtype, device=device)  # no float32 copy of 8B weights on the way
    model.reset_parameters(generator=torch.Generator(device=device).manual_seed(0))  # type: ignore[operator]
    return model.eval()


def _run(model: torch.nn.Module, cfg: SamplingConfig, batch: int, prompt_len: int, device: str,
         blocks_total: int, max_blocks: int) -> dict[str, Any]:
    """Decode `min(max_blocks, blocks_total)` blocks, time them and extrapolate to the full response."""
    vocab = int(model.get_output_embeddings().weight.shape[0]) if hasattr(model, "get_output_embeddings") else 1000
    vocab = min(vocab, 100_000)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    seeds = torch.arange(batch)
    measured = min(max_blocks, blocks_total)
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    if cfg.block_diffusion:
        fields["max_new_tokens"] = measured * cfg.block_length
        fields["stop_at_eos"] = False
    else:
        fields["max_new_tokens"] = measured * cfg.block_length
        fields["steps"] = cfg.steps_per_block * measured
    short = SamplingConfig(**fields)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    decode(model, ids, mask, seeds, short)
    if device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens = batch * short.max_new_tokens
    return {"measured_blocks": measured, "total_blocks": blocks_total, "seconds": secs,
            "tokens_per_s": tokens / secs, "extrapolated": measured < blocks_total,
            "est_full_seconds": secs * blocks_total / measured}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="2-layer models on CPU")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-blocks", type=int, default=None, help="blocks decoded per config before extrapolating")
    ap.add_argument("--cached-full", action="store_true",
                    help="decode every block (no extrapolation) in the block-diffusion KV-cache configs")
    ap.add_argument("--skip", default="", help="comma-separated substrings of config names to skip")
    args = ap.parse_args()
    skip = [x for x in args.skip.split(",") if x]
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch = args.batch or (4 if args.tiny else 64)
    p, r = (args.prompt_len, args.new_tokens) if not args.tiny else (32, 32)
    max_blocks = args.max_blocks or (2 if args.tiny else 2)
    rows: list[dict[str, Any]] = []

    llada = _model("LLaDA-8B-Instruct", args.tiny, device, dtype)
    bl = 32 if not args.tiny else 8
    nb = r // bl
    for name, kw in [
        ("llada no-cache", {"steps": r}),
        ("llada prefix", {"steps": r, "cache": "prefix"}),
        ("llada dual", {"steps": r, "cache": "dual"}),
        ("llada threshold0.9 (128 steps cap)", {"steps": r // 2, "threshold": 0.9}),
        ("llada prefix+threshold0.9", {"steps": r // 2, "cache": "prefix", "threshold": 0.9}),
    ]:
        if any(x in name for x in skip):
            continue
        cfg = SamplingConfig(max_new_tokens=r, block_length=bl, **kw)  # type: ignore[arg-type]
        rows.append({"config": name, **_run(llada, cfg, batch, p, device, nb, max_blocks)})
    del llada
    if device == "cuda":
        torch.cuda.empty_cache()

    for sdar_bl in (4, 32) if not args.tiny else (4, 8):
        sdar = _model("SDAR-8B-Chat", args.tiny, device, dtype, block_size=sdar_bl)
        nb = -(-r // sdar_bl)
        mb = max_blocks * (32 // sdar_bl if not args.tiny else 2)
        for name, kw in [("recompute", {"cache": None}), ("kv-cache", {"cache": "prefix"}),
                         ("kv-cache dyn0.9", {"cache": "prefix", "threshold": 0.9})]:
            label = f"sdar block{sdar_bl} {name}"
            if any(x in label for x in skip):
                continue
            cfg = SamplingConfig(max_new_tokens=r, block_length=sdar_bl, steps=sdar_bl, block_diffusion=True,
                                 **kw)  # type: ignore[arg-type]
            full = args.cached_full and kw["cache"] is not None
            rows.append({"config": label, **_run(sdar, cfg, batch, p, device, nb, nb if full else mb)})
        del sdar
        if device == "cuda":
            torch.cuda.empty_cache()

    head = f"{'config':40s} {'blocks':>9s} {'seconds':>9s} {'tok/s':>10s} {'est. full s':>11s}"
    print(f"device={device} dtype={dtype} batch={batch} prompt={p} new={r} (random weights)")
    print(head)
    for row in rows:
        tag = "*" if row["extrapolated"] else " "
        print(f"{row['config']:40s} {row['measured_blocks']:>4d}/{row['total_blocks']:<4d} {row['seconds']:9.2f} "
              f"{row['tokens_per_s']:10.1f} {row['est_full_seconds']:10.1f}{tag}")
    print("* extrapolated from the measured blocks (threshold decoding with random weights commits ~1 token/step)")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "rollout_bench.json").write_text(json.dumps(
            {"device": device, "batch": batch, "prompt_len": p, "new_tokens": r, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

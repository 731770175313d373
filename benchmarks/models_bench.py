"""Training-step benchmark of dllm_models at real shapes with random weights.

Measures, for LLaDA-8B and SDAR-8B (configs in benchmarks/configs/), one micro-batch of 8
sequences (4259 real tokens, padded to 1024):

- forward+backward time, MFU and peak memory of: padded SDPA with a key-padding mask (the model's
  own forward, full logits), packed rows with varlen / flex attention, and the packed step with the
  fused (logits-free) log-prob and gradient checkpointing;
- LoRA SFT peak memory at batch 8 x seq 1024 (LLaDA-8B, needs peft);
- fused log-prob peak memory at V = 126464 and 16k tokens against the naive log_softmax.

FLOPs (counted on real tokens only, so padding is wasted work):
    6 * P * T  +  12 * n_layers * (n_heads * head_dim) * sum_i s_i^2
with P all parameters (embedding included), T real tokens, s_i the real length of sequence i
(fwd+bwd attention score and value matmuls; BD3LM rows count their 2 s_i layout with the sparse
fraction of the mask). MFU is reported against the bf16 dense datasheet peak (989.4 TFLOP/s)
and against an 8192^3 bf16 matmul measured at start.

    python benchmarks/models_bench.py            # H200, bf16, well under 10 minutes
    python benchmarks/models_bench.py --tiny     # CPU smoke run at a tiny shape

JSON goes to $OUT/models_bench.json when $OUT is set (or --json PATH).
"""

from __future__ import annotations

import argparse
import gc
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
sys.path.insert(0, str(ROOT.parent / "packages" / "dllm-models" / "src"))

from dllm_models import empty_model  # noqa: E402
from dllm_models.attention import AttentionMask, bd3lm_mask  # noqa: E402
from dllm_models.logprob import final_hidden, naive_token_logprobs, output_head, token_logprobs  # noqa: E402
from dllm_models.packing import pack, pack_like  # noqa: E402

LENGTHS = [1024, 811, 640, 533, 421, 356, 270, 204]  # sum 4259, padded to 1024
PEAK_BF16 = 989.4e12
TINY = {
    "llada": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden_size": 128,
              "vocab_size": 512, "embedding_size": 512},
    "sdar": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "vocab_size": 512},
}
MODELS = {"LLaDA-8B": "llada", "SDAR-8B": "sdar"}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def timed(fn: Callable[[], None], device: torch.device, warmup: int, iters: int) -> tuple[float, float | None]:
    """(mean ms per call, peak GiB of one call)."""
    for _ in range(warmup):
        fn()
    sync(device)
    reset_peak(device)
    fn()
    sync(device)
    peak = peak_gib(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / iters * 1e3, peak


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Random weights (normal 0.02, unit norms) at the config's shape, built directly on device."""
    raw = json.loads((ROOT / "configs" / name / "config.json").read_text())
    if tiny:
        raw.update(TINY[MODELS[name]])
    model = empty_model(raw, dtype=dtype, device=device)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.fill_(1.0) if pname.endswith("norm.weight") or pname.endswith("ln_f.weight") else p.normal_(0, 0.02)
        for _, buf in model.named_buffers():
            if buf.is_floating_point():
                buf.zero_()
    return model.train()


def hidden_with_mask(model: nn.Module, ids: torch.Tensor, pos: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """Final hidden states [1, T, H] of a packed row with an explicit AttentionMask (packed
    `cu_seqlens` rows or the BD3LM layout), through the family's `final_hidden(..., attention=)`."""
    out: torch.Tensor = model.final_hidden(ids, position_ids=pos, attention=mask)  # type: ignore[operator]
    return out


def make_batch(lengths: list[int], pad_to: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (len(lengths), pad_to), generator=g)
    mask = torch.zeros(len(lengths), pad_to, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    targets = torch.randint(0, vocab, (len(lengths), pad_to), generator=g)
    return {"ids": ids.to(device), "mask": mask.to(device), "targets": targets.to(device)}


def flops(model: nn.Module, lengths: list[int], attn_pairs: float | None = None) -> float:
    p = sum(x.numel() for x in model.parameters())
    cfg: Any = model.config
    width = getattr(cfg, "n_heads", None) or getattr(cfg, "num_attention_heads", 0)
    head_dim = getattr(cfg, "head_dim", 0)
    layers = getattr(cfg, "n_layers", None) or getattr(cfg, "num_hidden_layers", 0)
    pairs = attn_pairs if attn_pairs is not None else float(sum(n * n for n in lengths))
    return 6.0 * p * sum(lengths) + 12.0 * layers * width * head_dim * pairs


def loss_of(logp: torch.Tensor) -> torch.Tensor:
    return -logp.float().mean()


def step_fns(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device, lengths: list[int]) -> dict[str, tuple[Callable[[], None], float]]:
    """Variant name -> (one fwd+bwd, attention score pairs counted for its FLOPs)."""
    ids, mask, targets = batch["ids"], batch["mask"], batch["targets"]
    packed = pack(ids, mask)
    p_targets = pack_like(targets, packed)[0]
    pmask = packed.attention_mask()  # block families add per-sequence block ids themselves
    block = getattr(model, "block_length", None)
    head = output_head(model)
    plain_pairs = float(sum(n * n for n in lengths))

    def padded(fused: bool) -> Callable[[], None]:
        def run() -> None:
            model.attention_backend = "sdpa"  # type: ignore[assignment]
            if fused:
                h = final_hidden(model, ids, attention_mask=mask)
                loss = loss_of(token_logprobs(h[mask], head.weight, targets[mask]))  # type: ignore[arg-type]
            else:
                logits = model(ids, attention_mask=mask).logits
                logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
                loss = loss_of(logp[mask])
            loss.backward()
            model.zero_grad(set_to_none=True)
        return run

    def packed_run(backend: str, fused: bool, amask: AttentionMask, ids_: torch.Tensor, pos: torch.Tensor, tgt: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            model.attention_backend = backend  # type: ignore[assignment]
            h = hidden_with_mask(model, ids_, pos, amask)[0]
            if fused:
                logp = token_logprobs(h, head.weight, tgt)  # type: ignore[arg-type]
            else:
                logp = naive_token_logprobs(h, head.weight, tgt)  # type: ignore[arg-type]
            loss_of(logp).backward()
            model.zero_grad(set_to_none=True)
        return run

    pid, ppos = packed.input_ids, packed.position_ids
    fast = "varlen" if device.type == "cuda" and block is None else "sdpa"
    out: dict[str, tuple[Callable[[], None], float]] = {
        "padded_sdpa": (padded(False), plain_pairs),
        f"packed_{fast}": (packed_run(fast, False, pmask, pid, ppos, p_targets), plain_pairs),
    }
    if device.type == "cuda":  # torch has no flex backward on CPU
        out["packed_flex"] = (packed_run("flex", False, pmask, pid, ppos, p_targets), plain_pairs)
    best = "flex" if (block is not None and device.type == "cuda") else fast
    out[f"packed_{best}_fused"] = (packed_run(best, True, pmask, pid, ppos, p_targets), plain_pairs)
    out[f"packed_{best}_fused_ckpt"] = (packed_run(best, True, pmask, pid, ppos, p_targets), plain_pairs)
    out["padded_sdpa_fused_ckpt"] = (padded(True), plain_pairs)
    if block is not None and device.type == "cuda":  # BD3LM [x_t ; x_0] training layout
        bmask = bd3lm_mask(lengths, block, device=device)
        seg_ids, seg_pos, seg_tgt = [], [], []
        for i, n in enumerate(lengths):
            s = int(packed.cu_seqlens[i])
            seg_ids += [pid[0, s:s + n]] * 2
            seg_pos += [ppos[0, s:s + n]] * 2
            seg_tgt += [p_targets[s:s + n], torch.full_like(p_targets[s:s + n], -100)]
        dense_pairs = _bd3lm_pairs(bmask, device)
        out["bd3lm_flex_fused_ckpt"] = (
            packed_run("flex", True, bmask, torch.cat(seg_ids)[None], torch.cat(seg_pos)[None], torch.cat(seg_tgt)),
            dense_pairs,
        )
    return out


def _bd3lm_pairs(mask: AttentionMask, device: torch.device) -> float:
    """Allowed (query, key) pairs of the BD3LM mask, counted per segment (small dense blocks)."""
    assert mask.cu_seqlens is not None and mask.block_ids is not None and mask.is_clean is not None
    total = 0.0
    cu = mask.cu_seqlens.tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        kb, kc = mask.block_ids[0, s:e], mask.is_clean[0, s:e]
        sub = AttentionMask(block_ids=kb[None], is_clean=kc[None]).dense(e - s, e - s, device)
        assert sub is not None
        total += float(sub.sum())
    return total


def bench_model(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, mm_peak: float) -> list[dict[str, Any]]:
    lengths = [max(1, n // 16) for n in LENGTHS] if args.tiny else LENGTHS
    pad_to = 64 if args.tiny else 1024
    rows: list[dict[str, Any]] = []
    try:
        model = build(name, args.tiny, device, dtype)
    except Exception as err:  # noqa: BLE001 - report and go on with the next model
        return [{"model": name, "variant": "build", "error": f"{type(err).__name__}: {err}"}]
    vocab = int(output_head(model).weight.shape[0])  # type: ignore[arg-type]
    batch = make_batch(lengths, pad_to, min(vocab, 100_000), device)
    fns = step_fns(model, batch, device, lengths)
    for variant, (fn, pairs) in fns.items():
        model.gradient_checkpointing = variant.endswith("ckpt")  # type: ignore[assignment]
        try:
            ms, peak = timed(fn, device, args.warmup, args.iters)
        except Exception as err:  # noqa: BLE001
            rows.append({"model": name, "variant": variant, "error": f"{type(err).__name__}: {err}"[:300]})
            continue
        tokens = sum(lengths) * (2 if variant.startswith("bd3lm") else 1)
        f = flops(model, lengths, pairs) if not variant.startswith("bd3lm") else (
            6.0 * sum(p.numel() for p in model.parameters()) * tokens + flops(model, [], pairs)
        )
        rows.append({
            "model": name, "variant": variant, "ms": round(ms, 2), "tokens": tokens,
            "tflops": round(f / ms / 1e9, 1),
            "mfu": round(f / (ms / 1e3) / PEAK_BF16, 3) if device.type == "cuda" else None,
            "mfu_vs_matmul": round(f / (ms / 1e3) / mm_peak, 3) if mm_peak else None,
            "peak_gib": None if peak is None else round(peak, 2),
        })
    model.gradient_checkpointing = False  # type: ignore[assignment]
    if MODELS[name] == "llada":
        rows += bench_lora(model, batch, pad_to, device, args)
    del model, fns
    reset_peak(device)
    return rows


def bench_lora(model: nn.Module, batch: dict[str, torch.Tensor], pad_to: int, device: torch.device, args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        from dllm_models.lora import apply_lora
        apply_lora(model, rank=16, alpha=32)
    except ImportError as err:
        return [{"model": "LLaDA-8B", "variant": "lora", "error": str(err)}]
    ids = batch["ids"]  # batch 8 x seq 1024, every token real
    targets = batch["targets"]
    head = output_head(model)
    rows = []
    for ckpt, fused in ((False, False), (True, True)):
        model.gradient_checkpointing = ckpt  # type: ignore[assignment]
        model.attention_backend = "sdpa"  # type: ignore[assignment]

        def run() -> None:
            if fused:
                h = final_hidden(model, ids)
                loss = loss_of(token_logprobs(h.flatten(0, 1), head.weight, targets.flatten()))  # type: ignore[arg-type]
            else:
                logits = model(ids).logits
                loss = loss_of(torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]))
            loss.backward()
            model.zero_grad(set_to_none=True)

        ms, peak = timed(run, device, 1, max(1, args.iters // 2))
        rows.append({"model": "LLaDA-8B", "variant": f"lora_r16{'_fused_ckpt' if ckpt else ''}",
                     "ms": round(ms, 2), "tokens": ids.numel(), "peak_gib": None if peak is None else round(peak, 2)})
    return rows


def bench_logprob(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    n, h, v = (256, 64, 1000) if args.tiny else (16384, 4096, 126464)
    rows = []
    for backend in ("naive", "chunked", "triton") if device.type == "cuda" else ("naive", "chunked"):
        reset_peak(device)
        g = torch.Generator(device=device).manual_seed(0)
        hidden = torch.randn(n, h, device=device, dtype=dtype, generator=g).requires_grad_(True)
        weight = (torch.randn(v, h, device=device, dtype=dtype, generator=g) * 0.02).requires_grad_(True)
        targets = torch.randint(0, v, (n,), device=device, generator=g)
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0

        def run() -> None:
            lp = token_logprobs(hidden, weight, targets, backend=backend)
            lp.sum().backward()
            hidden.grad = weight.grad = None

        try:
            ms, peak = timed(run, device, 1, args.iters)
        except Exception as err:  # noqa: BLE001
            rows.append({"variant": f"logprob_{backend}", "error": f"{type(err).__name__}: {err}"[:300]})
            continue
        extra = None if peak is None else round(peak - base / 2**30, 2)
        rows.append({"model": f"head V={v}", "variant": f"logprob_{backend}", "ms": round(ms, 2), "tokens": n,
                     "peak_gib": extra})
        del hidden, weight
    return rows


def matmul_peak(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    sync(device)
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--models", default="LLaDA-8B,SDAR-8B")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--json", default=None, help="JSON output path (default $OUT/models_bench.json)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args.iters = args.iters or (5 if device.type == "cuda" else 2)
    args.warmup = args.warmup if args.warmup is not None else (2 if device.type == "cuda" else 1)
    if not args.tiny and device.type != "cuda":
        sys.exit("real shapes need a CUDA GPU; pass --tiny for the CPU smoke run")
    t0 = time.perf_counter()
    mm = matmul_peak(device)
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        rows += bench_model(name, args, device, dtype, mm)
    rows += bench_logprob(args, device, dtype)
    report = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": str(dtype), "tiny": args.tiny,
        "lengths": LENGTHS if not args.tiny else [max(1, n // 16) for n in LENGTHS],
        "matmul_tflops": round(mm / 1e12, 1), "wall_s": round(time.perf_counter() - t0, 1), "rows": rows,
    }
    cols = ["model", "variant", "ms", "tokens", "tflops", "mfu", "mfu_vs_matmul", "peak_gib", "error"]
    print(f"device {report['device']}  torch {report['torch']}  matmul {report['matmul_tflops']} TFLOP/s")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols))
    print(f"wall {report['wall_s']} s")
    out = args.json or (os.path.join(os.environ["OUT"], "models_bench.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

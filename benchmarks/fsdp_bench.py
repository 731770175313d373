"""FSDP2 training-step and Ulysses sequence-parallel benchmark (torchrun, random weights).

Runs the distributed path of dllm_train on N ranks: a LLaDA model sharded with
`dllm_train.distributed.shard_model` (FSDP2 per block + root; bf16 compute, fp32 master weights
and gradient reduction on GPU), AdamW steps of a masked-diffusion cross-entropy on random tokens,
then the Ulysses check: `sp_forward` (sequence split across the ranks, all-to-all over heads
around attention) against the unsplit forward of the same sharded model.

    torchrun --nproc-per-node 2 benchmarks/fsdp_bench.py                # 2 GPUs, mid-size LLaDA
    torchrun --nproc-per-node 2 benchmarks/fsdp_bench.py --shape 8b     # LLaDA-8B-Instruct shape
    torchrun --nproc-per-node 2 benchmarks/fsdp_bench.py --tiny         # CPU, gloo, tiny config

Prints step time, tokens/s, peak memory and the equality result (rank 0); JSON goes to
$OUT/fsdp_bench.json when $OUT is set (or --json PATH). Wall time is never asserted on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from dllm_models import build_model
from dllm_train.distributed import full_state_dict, shard_model, sp_forward

ROOT = Path(__file__).resolve().parent
TINY: dict[str, Any] = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden_size": 128,
        "vocab_size": 50, "embedding_size": 50, "max_sequence_length": 4096, "mask_token_id": 49,
        "eos_token_id": 48, "pad_token_id": 48}
MID: dict[str, Any] = {"d_model": 2048, "n_layers": 16, "n_heads": 16, "n_kv_heads": 16, "mlp_hidden_size": 5632,
       "vocab_size": 126464, "embedding_size": 126464, "max_sequence_length": 8192,
       "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081}  # ~1.2B parameters


def config(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiny:
        raw = dict(TINY)
    elif args.shape == "8b":
        raw = json.loads((ROOT / "configs" / "LLaDA-8B-Instruct" / "config.json").read_text())
    else:
        raw = dict(MID)
    raw.update(model_type="llada", architectures=["LLaDAModelLM"], rope_theta=raw.get("rope_theta", 500000.0),
               rms_norm_eps=raw.get("rms_norm_eps", 1e-5), torch_dtype="float32")
    return raw


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """normal(0, 0.02) weights, unit norms; each rank fills its own shard (identical on CPU tiny)."""
    gens: dict[str, torch.Generator] = {}
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
            local.fill_(1.0)
        else:
            key = str(local.device)
            g = gens.setdefault(key, torch.Generator(device=local.device).manual_seed(seed))
            local.normal_(0.0, 0.02, generator=g)


def batch(args: argparse.Namespace, raw: dict[str, Any], device: torch.device, step: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    ids = torch.randint(0, raw["vocab_size"] - 2, (args.batch, args.seq_len), generator=g)
    masked = torch.rand(args.batch, args.seq_len, generator=g) < 0.5
    noisy = ids.masked_fill(masked, raw["mask_token_id"])
    return noisy.to(device), ids.to(device), masked.to(device)


def train(model: torch.nn.Module, args: argparse.Namespace, raw: dict[str, Any], device: torch.device) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times, loss = [], 0.0
    for step in range(args.warmup + args.steps):
        noisy, ids, masked = batch(args, raw, device, step)
        sync(device)
        t0 = time.perf_counter()
        logits = model(noisy).logits
        ce = F.cross_entropy(logits[masked].float(), ids[masked])
        torch.autograd.backward(ce)
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        loss = float(ce.detach())
        del logits, ce
    med = statistics.median(times)
    tokens = args.batch * args.seq_len * dist.get_world_size()
    return {"step_time_s": med, "tokens_per_s": tokens / med, "last_loss": loss}


def sp_check(model: torch.nn.Module, args: argparse.Namespace, raw: dict[str, Any], device: torch.device) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    length = args.sp_seq_len
    ids = torch.randint(0, raw["vocab_size"] - 2, (1, length), generator=g).to(device)
    mask = torch.ones(1, length, dtype=torch.bool, device=device)
    mask[0, : length // 8] = False  # left padding, so the gathered key-padding mask is exercised
    model.eval()
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits.float()
        sync(device)
        t0 = time.perf_counter()
        split = sp_forward(model, ids, mask).float()
        sync(device)
        t_sp = time.perf_counter() - t0
    model.train()
    real = mask[0]
    err = float((full - split)[:, real].abs().max())
    scale = float(full[:, real].abs().max())
    tol = 1e-4 if full.dtype == torch.float32 and device.type == "cpu" else 3e-2
    return {"sp_seq_len": length, "sp_max_abs_diff": err, "sp_logit_scale": scale,
            "sp_equal": err <= tol * max(1.0, scale), "sp_forward_s": t_sp}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config (CPU/gloo smoke run)")
    parser.add_argument("--shape", choices=["mid", "8b"], default="mid")
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--sp-seq-len", type=int, default=None, help="sequence length of the Ulysses check")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--attention", default="sdpa", help="attention backend (sdpa, flex, varlen)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--cpu-bf16", action="store_true", help="bf16 compute on CPU too (checks the mixed-precision path without a GPU)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    args.batch = args.batch or (2 if args.tiny or args.shape == "8b" else 4)
    args.seq_len = args.seq_len or (32 if args.tiny else 2048)
    args.sp_seq_len = args.sp_seq_len or (30 if args.tiny else 16384)
    raw = config(args)

    t0 = time.perf_counter()
    with torch.device("meta"):
        model = build_model(raw)
    model.attention_backend = args.attention
    shard_model(model, param_dtype=torch.bfloat16 if (cuda or args.cpu_bf16) else None)
    model.to_empty(device=device)
    init_weights(model, seed=rank if cuda else 0)
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    result: dict[str, Any] = {"world_size": world, "device": str(device), "shape": "tiny" if args.tiny else args.shape,
                              "params": n_params, "batch_per_rank": args.batch, "seq_len": args.seq_len,
                              "build_s": build_s, **train(model, args, raw, device)}
    if cuda:
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    result.update(sp_check(model, args, raw, device))
    if cuda:
        result["peak_memory_gib_with_sp"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.tiny:  # the gathered weights round-trip (the rollout hand-off)
        full = full_state_dict(model)
        result["full_state_dict_tensors"] = len(full)
    results: list[Any] = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        for r in results:
            print(json.dumps(r))
        path = args.json or (os.path.join(os.environ["OUT"], "fsdp_bench.json") if os.environ.get("OUT") else None)
        if path:
            Path(path).write_text(json.dumps(results, indent=2))
        print("SP equality:", "PASS" if all(r["sp_equal"] for r in results) else "FAIL")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

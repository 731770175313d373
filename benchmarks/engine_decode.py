"""Native block decoding against lmdeploy's PyTorch engine on the same folder, in one process.

Both decoders serve the same release-layout folder (the real config and tokenizer, random bf16
weights from `dllm_models.save_model`), the same GSM8K chat prompts as token ids, greedy, block 4
with one token per step (4 static steps), every row decoded to the full length (EOS ignored, so
both do the same work). Native is `dllm_rollout.generate` (the code `dare train` and `dare eval`
run); lmdeploy runs through `dllm_rollout.engines.LMDeployEngine` (the adapter `dare` uses).

Printed per (rows, new tokens): seconds, tokens/s, native / lmdeploy, and the greedy agreement
(share of response tokens equal, and the mean length of the common prefix).
Engines: `native` and its switched variants (`SWITCHES`: `native_nofold`, `native_sdpa`, `native_keep`,
`native_nospan`, `native_split2`: config values, not module attributes), `native_lora` /
`native_lora_unmerged`, `lmdeploy`: several variants in one process, each on a fresh load of the folder.
`--stop-token auto` (or ids) measures rows that stop at different lengths, as a trained model's do:
random weights almost never emit the real EOS, so tokens the random model does emit play the stop
ids for both engines (native: `traits.stop_ids`, `stop_at_eos`; lmdeploy: `stop_token_ids`). `auto`
picks, from a pilot greedy decode without stops, a set of tokens whose earliest first occurrence per
row (the full length where none occurs) has its mean nearest `--stop-mean` (a fraction of the new
tokens): one pilot for the native variants, and lmdeploy's own pilot for lmdeploy (on random weights
their greedy tokens part after a few tokens, so one set would stop them at different lengths).
Both also stop at the folder's EOS ids. tokens/s then counts the tokens each row generated up to its stop.
`--threshold T` (issue 35 item 6): both decode with DARE's threshold rule at T instead of the static
quota: native `remasking="low_confidence_dynamic"` (docs/generation.md#threshold-rule), lmdeploy
`low_confidence_dynamic` at the same threshold (the sdar-bgpo recipe's rule; 0.9 there). Random weights
rarely pass a threshold, so pair it with `--head-scale` (a sharper head commits several tokens per step);
native rows also print `response_tokens_per_step` (response tokens over the denoising steps the rows took;
the rest of a terminal block takes steps too, so a rule of one token a step prints slightly under 1).
With `--engine-checks`: the weight hand-off (load changed weights -> output changes; restore ->
output back), sleep/wake, the exact served-weights check, and the per-row settings reproduction.

    python3 benchmarks/e2e_gpu.py --prepare-devshare --runs sdar-bgpo          # here, once
    python3 benchmarks/engine_decode.py --rows 64,128 --new 1024,2048 --engine-checks   # H200
    python3 benchmarks/engine_decode.py --rows 128 --new 1024 --threshold 0.9 --head-scale 10 --workdir /dev/shm/ed_thr  # H200
    uv run python benchmarks/engine_decode.py --tiny --engines native            # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_gpu import _default_dir, prepare_model  # noqa: E402


def sharpen_head(folder: Path, scale: float) -> None:
    """Multiply the folder's `lm_head.weight` by `scale` once (a marker file records it).

    Random weights give nearly flat logits, whose argmax flips under any rounding difference, so
    greedy agreement between two correct implementations is near zero; a sharper head makes the
    argmax robust and the agreement a test of "same function".
    """
    from safetensors.torch import load_file, save_file

    marker = folder / f".head_scale_{scale:g}"
    if scale == 1.0 or marker.exists():
        return
    index = folder / "model.safetensors.index.json"
    name = json.loads(index.read_text())["weight_map"]["lm_head.weight"] if index.exists() else "model.safetensors"
    tensors = load_file(str(folder / name))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * scale
    save_file(tensors, str(folder / name), metadata={"format": "pt"})
    marker.write_text("")


def chat_prompts(folder: Path, data: Path, n: int) -> list[list[int]]:
    """`n` GSM8K questions as chat-template token ids (cycled when the file has fewer)."""
    import pyarrow.parquet as pq
    from dllm_models import load_tokenizer

    tok = load_tokenizer(folder)
    table = pq.read_table(data).to_pylist()
    out = []
    for i in range(n):
        row = table[i % len(table)]
        prompt = row.get("prompt")
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(row.get("question", prompt))}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append([int(t) for t in tok(text, add_special_tokens=False)["input_ids"]])
    return out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pick_stop_tokens(responses: list[list[int]], mean: float, most: int = 64) -> tuple[tuple[int, ...], dict[str, float]]:
    """Stop tokens whose earliest first occurrence in each row (the row's length where none occurs)
    has its mean nearest `mean` x the response length, chosen greedily (at most `most` tokens: random
    weights spread their tokens thinly, so one token stops few rows); with the lengths they give
    (mean and median fraction, share of rows that stop)."""
    n = max(len(r) for r in responses)
    firsts: dict[int, list[int]] = {}
    for b, row in enumerate(responses):
        seen: dict[int, int] = {}
        for i, tok in enumerate(row):
            seen.setdefault(tok, i)
        for tok, i in seen.items():
            firsts.setdefault(tok, [n] * len(responses))[b] = i
    if not firsts:
        raise SystemExit("engine_decode: the pilot generated nothing; pass --stop-token ID")
    # candidates: the tokens that occur in the most rows
    candidates = sorted(firsts, key=lambda t: -sum(i < n for i in firsts[t]))[:512]
    ends, chosen = [n] * len(responses), list[int]()
    gap = abs(1.0 - mean)
    while len(chosen) < most:
        # (distance of the mean stop to `mean` once the token joins, token) for every candidate left
        best = min(((abs(sum(map(min, ends, firsts[t])) / len(ends) / n - mean), t)
                    for t in candidates if t not in chosen), key=lambda c: c[0], default=None)
        if best is None or best[0] >= gap:
            break
        gap, pick = best
        chosen.append(pick)
        ends = list(map(min, ends, firsts[pick]))
    lengths = sorted(ends)
    return tuple(chosen), {"stop_tokens": len(chosen), "mean_fraction": round(sum(lengths) / len(lengths) / n, 3),
                           "median_fraction": round(lengths[len(lengths) // 2] / n, 3),
                           "rows_stopping": round(sum(e < n for e in ends) / len(ends), 3)}


# the switches of each native variant, as config values: `speed` fields of the rollout's `SpeedConfig`,
# `kernels` fields of the model's `KernelConfig` (the defaults otherwise)
SWITCHES: dict[str, dict[str, dict[str, Any]]] = {
    "native": {},
    "native_sdpa": {"kernels": {"decode_attention": False}},  # dense-mask sdpa, no decode kernel
    "native_nofold": {"speed": {"fold_store": False}},        # a separate store pass per block
    "native_keep": {"speed": {"retire_rows": 0}},             # finished rows stay in the batch
    "native_nospan": {"kernels": {"decode_span": False}},     # the kernel walks every tile, skipping hidden ones
    "native_split2": {"kernels": {"decode_splits": 2}},
    "native_lora": {}, "native_lora_unmerged": {},
}


def threshold_settings(threshold: float | None) -> dict[str, Any]:
    """The decoding settings of DARE's threshold rule at `threshold` (none: the static quota)."""
    if threshold is None:
        return {}
    return {"remasking": "low_confidence_dynamic", "threshold": threshold}


def native(folder: Path, prompts: list[list[int]], new: int, device: str, *, lora: str = "",
           switches: dict[str, Any] | None = None, stop_tokens: tuple[int, ...] = (),
           threshold: float | None = None, stats: dict[str, Any] | None = None) -> tuple[float, list[list[int]]]:
    """Seconds and responses of the native decoder (after one warm-up call on 2 rows).

    `switches`: the variant's config values for this run (`SWITCHES[engine]`).
    `threshold`: DARE's threshold rule at this threshold (`threshold_settings`); `stats` then receives
    `response_tokens_per_step`, the mean tokens a row commits per denoising step.
    `stop_tokens`: rows stop after the block holding one of them (`stop_at_eos` with them as the
    model's stop ids); the responses are then cut after the first.
    `lora="merged"`: rank-64 adapters (non-zero B) decoded through the rollout worker (`dare train`'s
    path, adapters folded in); `lora="unmerged"`: the same model through `generate` (adapters applied
    at every call: the worker's path before).
    """
    import dataclasses

    from dllm_models import apply_lora, load_model
    from dllm_rollout import SamplingConfig, SpeedConfig, generate
    from dllm_train.workers import RolloutWorker

    switches = switches or {}
    model = load_model(folder, dtype=torch.bfloat16, device=device).eval()
    model.kernels = dataclasses.replace(model.kernels, **switches.get("kernels", {}))
    kw: dict[str, Any] = dict(max_new_tokens=new, steps=4, block_length=4, temperature=0.0, cache="prefix",
                              stop_at_eos=False, speed=SpeedConfig(**switches.get("speed", {})),
                              **threshold_settings(threshold))
    if threshold is not None:
        kw["record_trajectory"] = True  # the steps each row took (response_tokens_per_step)
    if stop_tokens:
        from dllm_models import generation_stop_ids

        # lmdeploy stops at the folder's EOS ids as well (it adds them to every request): so does native here
        model.traits = dataclasses.replace(model.traits, eos_token_id=stop_tokens[0],
                                           stop_token_ids=stop_tokens[1:] + generation_stop_ids(folder))
        kw.update(stop_at_eos=True, eos_handling="truncate")

    def run(p: list[list[int]], new_tokens: int = new) -> Any:
        return generate(model, p, **{**kw, "max_new_tokens": new_tokens})

    if lora:
        model = apply_lora(model, rank=64, alpha=128).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.01)
        if lora == "merged":
            def run(p: list[list[int]], new_tokens: int = new) -> Any:  # noqa: F811
                cfg = SamplingConfig(**{**kw, "max_new_tokens": new_tokens}, block_diffusion=True)
                return RolloutWorker(model, cfg).generate(p, torch.arange(len(p)))

    run(prompts, 8)  # warm-up at the measured batch size (kernels, allocator), 8 tokens
    _sync()
    t0 = time.perf_counter()
    batch = run(prompts)
    _sync()
    seconds = time.perf_counter() - t0
    out = responses(batch)
    if stats is not None and batch.unmask_step is not None:
        steps = (batch.unmask_step.max(dim=1).values + 1).clamp(min=1)  # steps each row took
        stats["response_tokens_per_step"] = round(sum(map(len, out)) / float(steps.sum()), 3)
    del model, batch
    gc.collect()
    torch.cuda.empty_cache()
    return seconds, out


def profile_native(folder: Path, prompts: list[list[int]], new: int, device: str) -> None:
    """Where one native decode of `new` tokens spends its time.

    Prints the wall time, the GPU time inside the graphed block steps (CUDA events around every
    `GraphedStep` call, so the sum is what the replays took on the GPU, gaps excluded), the rest
    (eager sampling and bookkeeping, host gaps) and a torch.profiler table of the top CUDA kernels.
    """
    from torch.profiler import ProfilerActivity, profile

    import dllm_rollout.graphs as graphs
    from dllm_models import load_model
    from dllm_rollout import generate

    model = load_model(folder, dtype=torch.bfloat16, device=device).eval()
    kw = dict(max_new_tokens=new, steps=4, block_length=4, temperature=0.0, cache="prefix", stop_at_eos=False)
    generate(model, prompts, **kw)  # type: ignore[arg-type]
    _sync()
    events: list[tuple[Any, Any]] = []
    call = graphs.GraphedStep.__call__

    def timed(self: Any, *inputs: Any) -> Any:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = call(self, *inputs)
        b.record()
        events.append((a, b))
        return out

    if device == "cuda":
        graphs.GraphedStep.__call__ = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    generate(model, prompts, **kw)  # type: ignore[arg-type]
    _sync()
    wall = time.perf_counter() - t0
    graphs.GraphedStep.__call__ = call  # type: ignore[method-assign]
    inside = sum(a.elapsed_time(b) for a, b in events) / 1e3
    print(json.dumps({"profile_rows": len(prompts), "profile_new": new, "wall_s": round(wall, 3),
                      "graphed_calls": len(events), "graphed_gpu_s": round(inside, 3),
                      "graphed_ms_per_call": round(1e3 * inside / max(len(events), 1), 2),
                      "outside_graphs_s": round(wall - inside, 3)}), flush=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        generate(model, prompts, **kw)  # type: ignore[arg-type]
        _sync()
    key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=90), flush=True)
    del model
    gc.collect()
    torch.cuda.empty_cache()


def responses(batch: Any) -> list[list[int]]:
    """Each row's response tokens up to its mask's end (through the stop token where it stopped)."""
    return [ids[:int(m.sum())] for ids, m in zip(batch.response_ids.tolist(), batch.response_mask)]


def engine_cfg(new: int, stop: bool = False, threshold: float | None = None) -> Any:
    from dllm_rollout import SamplingConfig

    return SamplingConfig(max_new_tokens=new, steps=4, block_length=4, temperature=0.0, cache="prefix",
                          stop_at_eos=stop, block_diffusion=True, eos_handling="truncate" if stop else "keep",
                          **threshold_settings(threshold))


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Share of equal tokens and mean common-prefix length of two response lists (`token_agreement`)."""
    from dllm_train.engine_rollout import token_agreement

    share, prefix = token_agreement(a, b)
    return {"token_agreement": round(share, 4), "mean_common_prefix": round(prefix, 1)}


def engine_checks(engine: Any, folder: Path, prompts: list[list[int]], device: str) -> dict[str, Any]:
    """Hand-off, sleep/wake, served-weights check and the per-row settings reproduction."""
    from dllm_models import load_model

    out: dict[str, Any] = {}
    probe = prompts[:4]
    base = engine.generate(probe).response_ids.tolist()
    model = load_model(folder, dtype=torch.bfloat16, device=device)
    ref = dict(model.named_parameters())
    check = engine.check_weights(ref)
    out["served_check_initial"] = {"ok": check.ok, "compared": check.compared, "total": check.total,
                                   "mismatched": list(check.mismatched[:5])}
    changed = {k: (v * 1.5 if k.endswith("o_proj.weight") else v) for k, v in ref.items()}
    t0 = time.perf_counter()
    engine.load_weights(changed.items())
    out["load_weights_s"] = round(time.perf_counter() - t0, 2)
    moved = engine.generate(probe).response_ids.tolist()
    out["changed_weights_change_output"] = moved != base
    out["probe_row0_before_after"] = [base[0][:12], moved[0][:12]]
    out["served_check_changed_vs_original"] = engine.check_weights(ref).ok
    engine.sleep()
    free_asleep = torch.cuda.mem_get_info()[0] / 2**30
    t0 = time.perf_counter()
    engine.wake(ref.items())
    out["wake_with_weights_s"] = round(time.perf_counter() - t0, 2)
    out["free_gib_asleep"] = round(free_asleep, 1)
    out["served_check_after_wake"] = engine.check_weights(ref).ok
    out["restored_output_equal"] = engine.generate(probe).response_ids.tolist() == base
    del model, ref, changed
    gc.collect()
    torch.cuda.empty_cache()
    out["per_row_settings"] = per_row_reproduction(engine, probe[0])
    return out


def per_row_reproduction(engine: Any, prompt: list[int]) -> dict[str, Any]:
    """Do per-sequence settings reach their own rows in lmdeploy 0.18's dLLM sampler?

    Every row decodes the same prompt. A greedy row's tokens are fixed by the weights and its
    neighbours' tokens only (the same prompt everywhere, so beside greedy copies every row is the
    alone-output). Runs:
    - control `[g, g, g, g]`: every row must equal the greedy row alone;
    - `[g, h, h, h]` (h: temperature 1.5, no top-k): row 0 must stay unchanged if its settings are
      its own. With settings repeated block-major over sequence-major logits (block 4), row 0's 4
      positions take rows 0-3's settings, so 3 of them would be sampled hot;
    - `[g, g, g, g, h, h, h, h]`: the block-major map sends row 0's positions to rows 0-3
      (greedy) but row 1's to rows 4-7 (hot), so the bug predicts row 0 unchanged and row 1
      changed, a pattern batch-dependent rounding does not produce.
    """
    import asyncio

    lm = engine.lmdeploy
    greedy = lm.GenerationConfig(max_new_tokens=64, do_sample=False, top_k=1, ignore_eos=True)
    hot = lm.GenerationConfig(max_new_tokens=64, do_sample=True, temperature=1.5, top_k=0, top_p=1.0, ignore_eos=True)

    async def mixed(configs: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*[engine._one(list(prompt), g) for g in configs]))

    alone = engine._run(mixed([greedy]))[0].token_ids

    def same(layout: list[Any]) -> list[bool]:
        outs = engine._run(mixed(layout))
        return [outs[i].token_ids == alone for i, g in enumerate(layout) if g is greedy]

    return {"control_gggg_rows_equal_alone": [same([greedy] * 4) for _ in range(2)],
            "ghhh_greedy_rows_equal_alone": [same([greedy, hot, hot, hot]) for _ in range(3)],
            "gggghhhh_greedy_rows_equal_alone": [same([greedy] * 4 + [hot] * 4) for _ in range(3)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="SDAR-8B-Chat")
    ap.add_argument("--rows", default="128")
    ap.add_argument("--new", default="1024")
    ap.add_argument("--shapes", default="", help="rows x new pairs, e.g. 128x1024,64x1024 (replaces --rows x --new)")
    ap.add_argument("--engines", default="native,lmdeploy")
    ap.add_argument("--engine-checks", action="store_true")
    ap.add_argument("--profile", type=int, default=0, help="profile one native decode of this many new tokens")
    ap.add_argument("--workdir", type=Path, default=Path("/dev/shm/engine_decode"))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--head-scale", type=float, default=1.0, help="sharpen the random head (greedy agreement)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="DARE's threshold rule at this threshold for both engines (native low_confidence_dynamic, "
                         "lmdeploy low_confidence_dynamic) instead of the static quota")
    ap.add_argument("--stop-token", default="", help="ids (comma-separated), or auto: rows stop at them (module doc)")
    ap.add_argument("--stop-mean", type=float, default=0.4, help="with --stop-token auto: the mean stop, a fraction")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    info = prepare_model(args.model, _default_dir("checkpoints"), args.workdir, tiny=args.tiny, device=device)
    print(json.dumps(info), flush=True)
    folder = Path(info["folder"])
    sharpen_head(folder, args.head_scale)
    rows = [int(x) for x in args.rows.split(",")]
    news = [int(x) for x in args.new.split(",")]
    shapes = [(r, n) for r in rows for n in news]
    if args.shapes:
        shapes = [(int(a), int(b)) for a, b in (x.split("x") for x in args.shapes.split(","))]
        rows, news = sorted({r for r, _ in shapes}), sorted({n for _, n in shapes})
    data = _default_dir("data") / "rl/train/gsm8k_1.parquet"
    prompts_all = chat_prompts(folder, data, max(rows))
    engines = args.engines.split(",")
    results: list[dict[str, Any]] = []
    outputs: dict[tuple[str, int, int], list[list[int]]] = {}
    if args.profile:
        profile_native(folder, prompts_all[:max(rows)], args.profile, device)
    stops: dict[tuple[int, int], tuple[int, ...]] = {}
    for r, n in shapes if args.stop_token else []:
        if args.stop_token != "auto":
            stops[r, n] = tuple(int(t) for t in args.stop_token.split(","))
            continue
        s, pilot = native(folder, prompts_all[:r], n, device, threshold=args.threshold)  # full length: no-stop figure too
        toks, stats = pick_stop_tokens(pilot, args.stop_mean)
        stops[r, n] = toks
        row = {"engine": "native (pilot, no stop)", "rows": r, "new": n, "s": round(s, 2), "tok_s": round(r * n / s),
               "stop_tokens": list(toks), **stats}
        results.append(row)
        print(json.dumps(row), flush=True)
    for name in [e for e in engines if e.startswith("native")]:
        for r, n in shapes:
            lora = {"native_lora": "merged", "native_lora_unmerged": "unmerged"}.get(name, "")
            if name not in SWITCHES:
                raise SystemExit(f"engine_decode: unknown engine {name!r}; choose from {sorted(SWITCHES)} or lmdeploy")
            stats: dict[str, Any] = {}
            s, out = native(folder, prompts_all[:r], n, device, lora=lora, switches=SWITCHES[name],
                            stop_tokens=stops.get((r, n), ()), threshold=args.threshold, stats=stats)
            outputs[name, r, n] = out
            tokens = sum(map(len, out))
            row = {"engine": name, "rows": r, "new": n, "s": round(s, 2), "tok_s": round(tokens / s),
                   "tokens": tokens, "threshold": args.threshold, **stats}
            ref = {"native_lora_unmerged": "native_lora", "native_lora": ""}.get(name, "native")
            if ref and name != ref and (ref, r, n) in outputs:
                row.update(agreement(outputs[ref, r, n], out))
            results.append(row)
            print(json.dumps(row), flush=True)
    if "lmdeploy" in engines:
        from dllm_rollout.engines import LMDeployEngine

        t0 = time.perf_counter()
        from dllm_models import generation_stop_ids

        gen_cfg = json.loads((folder / "generation_config.json").read_text())
        if len(set(stops.values())) > 1:
            raise SystemExit("engine_decode: lmdeploy takes one set of stop ids per engine; measure one shape, "
                             "or pass --stop-token IDS")
        # the native decoder's stop ids: the folder's (ignored unless rows stop), or the chosen stop tokens
        stop_ids = next(iter(stops.values())) if stops else generation_stop_ids(folder)
        engine = LMDeployEngine(folder, engine_cfg(max(news), threshold=args.threshold), stop_ids=stop_ids, pad_id=int(gen_cfg.get("pad_token_id", 0)),
                                engine_options={"max_batch_size": max(rows), "cache_max_entry_count": 0.6,
                                                "session_len": max(len(p) for p in prompts_all) + max(news) + 8})
        print(json.dumps({"lmdeploy_start_s": round(time.perf_counter() - t0, 1)}), flush=True)
        for r, n in shapes:
            engine.cfg = engine_cfg(n, stop=bool(stops), threshold=args.threshold)
            engine.generate(prompts_all[:r], cfg=engine_cfg(8, threshold=args.threshold))  # warm-up, measured batch
            _sync()
            if args.stop_token == "auto":  # lmdeploy's own greedy tokens differ: its own stop set, the same mean
                t0 = time.perf_counter()
                pilot = responses(engine.generate(prompts_all[:r], cfg=engine_cfg(n, threshold=args.threshold)))
                s = time.perf_counter() - t0
                toks, stats = pick_stop_tokens(pilot, args.stop_mean)
                engine.stop_ids = toks
                row = {"engine": "lmdeploy (pilot, no stop)", "rows": r, "new": n, "s": round(s, 2),
                       "tok_s": round(r * n / s), "stop_tokens": list(toks), **stats}
                results.append(row)
                print(json.dumps(row), flush=True)
            t0 = time.perf_counter()
            try:
                out = responses(engine.generate(prompts_all[:r]))
            except Exception as err:  # noqa: BLE001 - a failed shape is a result; the next one may run
                print(json.dumps({"engine": "lmdeploy", "rows": r, "new": n, "error": repr(err)[:300]}), flush=True)
                continue
            s = time.perf_counter() - t0
            outputs["lmdeploy", r, n] = out
            tokens = sum(map(len, out))
            row = {"engine": "lmdeploy", "rows": r, "new": n, "s": round(s, 2), "tok_s": round(tokens / s), "tokens": tokens,
                   "threshold": args.threshold}
            if ("native", r, n) in outputs:
                row.update(agreement(outputs["native", r, n], out))
                nat = next(x for x in results if x["engine"] == "native" and x["rows"] == r and x["new"] == n)
                row["native_over_lmdeploy"] = round(nat["tok_s"] / row["tok_s"], 3)
            results.append(row)
            print(json.dumps(row), flush=True)
            print(json.dumps({"lmdeploy_row0": out[0][:24], "native_row0": outputs.get(("native", r, n), [[]])[0][:24],
                              "lmdeploy_distinct_tokens": len({t for o in out for t in o})}), flush=True)
        if args.engine_checks:
            print(json.dumps({"engine_checks": engine_checks(engine, folder, prompts_all, device)}), flush=True)
        engine.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

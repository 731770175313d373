"""Scale-out of `dare train` over Ray ranks: a scaling curve and the MoE row (issue 14).

The user's command, `python apps/dare train <recipe> ... trainer.backend=ray trainer.num_workers=N
trainer.gpus_per_worker=1`, run as a subprocess on random-weight model folders in the release
layout. Model folders, data files and the subprocess machinery are benchmarks/e2e_gpu.py's
(`prepare_model`, `write_data`, `run_command`, `train_overrides`); only `trainer.max_steps`,
`rl.prompts_per_step` and the Ray fields are set, every per-sequence setting stays the recipe's.

- Curve (`--curve 1,2,4,8`): `--recipe` (sdar-bgpo) on `--model` (SDAR-8B-Chat) with N ranks of
  one GPU each (FSDP2 over NCCL), the rows per GPU fixed: `rl.prompts_per_step = N x
  --prompts-per-gpu`, so N GPUs do N times the work of one. N=1 runs through Ray as well, so every
  point takes the same code path.
- MoE row (`--moe`): sdar_moe-cj-grpo on SDAR-30B-A3B-Chat at its released shape on `--moe-gpus`
  ranks (8). Expert placement today: FSDP only. `dllm_train.distributed.shard_model` applies
  `fully_shard` to every decoder block and then the root, so each expert's weights are split
  along dim 0 over all N ranks like every other parameter. A block's forward all-gathers all of
  its experts, routed to or not. There is no expert parallelism. The row gives the expert
  parameter count and its bf16 share per rank.

Columns, from each run's metrics.jsonl and the wall-clock arrival of its lines:
- s/step: the mean wall time of the steps after the first. When at least two remain, the last step
  is left out as well: its line waits for the driver to gather the trained weights
  (`RayRLWorkflow.pull_weights` at the last step), which a long run pays only at eval/save steps.
- rollout / old / ref / update: the ranks' mean seconds of each part (`rl_step` averages them
  over ranks), averaged over the same steps. parts = their sum. s/step - parts is the time spent
  outside those parts (driver, Ray calls, the weight hand-off to the rollout replica).
- gen tok/s: response tokens of a step (mean response length x rows) / rollout_s. Every rank
  decodes its rows in parallel, so this is the whole group's rate. Per GPU it is divided by N.
- peak GiB: the largest `peak_gib` of the run's steps. Every rank reports
  `torch.cuda.max_memory_allocated` since its previous step, and `dllm_train.rl_step` keeps the
  largest rank's value (the max over ranks). It is empty on CPU. host GiB: the largest sampled sum
  of the proportional resident memory (PSS) of the command's processes: the driver, the Ray daemons
  and the ranks, with shared pages split among the processes that map them. It is measured only
  with --max-rss-gib (default with --tiny).
- rows/s: rows per step / s/step. eff: scaling efficiency against the smallest N measured,
  (rows/s at N / N) / (rows/s at N0 / N0). With N0 = 1 this is (rows/s at N) / (N x rows/s at 1).

Commands (the release configs and data on the GPU machine come from
`uv run python benchmarks/scale_out.py --prepare-devshare`, which copies them into .devshare/):

    python3 benchmarks/scale_out.py --curve 1,2 --prompts-per-gpu 1 --steps 3 --workdir /dev/shm/scale   # nvidia-h200-x2
    python3 benchmarks/scale_out.py --curve 1,2,4,8 --prompts-per-gpu 1 --steps 3 --workdir /dev/shm/scale # nvidia-h200-x8
    python3 benchmarks/scale_out.py --curve "" --moe --moe-gpus 8 --steps 3                               # nvidia-h200-x8
    python3 benchmarks/scale_out.py --curve 8 --merge scale_out_1_2.json ...  # one point per command, merged
    uv run python benchmarks/scale_out.py --tiny --moe          # toy shapes, 2 CPU ranks (gloo): the slow test

One SDAR-8B point takes about a minute to start (the model folder is written once and then reused)
plus about 100 s per step at 8 rows per GPU (measured on one H200 without Ray: 26 s rollout, 72 s
update). Where a command may run at most 10 minutes, run one point per command and pass the
earlier points' JSON with --merge, so the efficiency column spans them. Each run's checkpoints/
and model/ are deleted after it (8B: about 64 GB), unless --keep-outputs is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_gpu  # noqa: E402  (puts every workspace member's src on sys.path)
import torch  # noqa: E402
from e2e_gpu import REPO, RunSpec, _fmt, _mean, read_jsonl, run_command, status_of, tail  # noqa: E402

RAY_ENV = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_USAGE_STATS_ENABLED": "0"}
MOE_PLACEMENT = "FSDP2-sharded with the rest of the parameters (no expert parallelism)"
PARTS = ("rollout_s", "old_s", "reference_s", "update_s")


# ----------------------------------------------------------------------------- figures


def step_seconds(line_times: Sequence[float]) -> list[float]:
    """Wall seconds of the steps used for s/step, from the arrival times of the metrics lines.

    The first step is dropped (start-up, compilation). When at least two steps remain, the last
    is dropped too, because its line also waits for the driver's gather of the trained weights.
    With one or two lines, whatever remains is used.
    """
    gaps = [b - a for a, b in zip(line_times, line_times[1:])]
    return gaps[:-1] if len(gaps) >= 2 else gaps


def steady_records(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics records of the steps `step_seconds` uses (all of them with fewer than 2 lines)."""
    if len(recs) >= 3:
        return recs[1:-1]
    return recs[1:] if len(recs) == 2 else recs


def scaling_efficiency(points: Sequence[tuple[int, float | None]]) -> dict[int, float]:
    """Efficiency of each (gpus, rows/s) point against the point with the fewest GPUs that has a rate.

    eff(N) = (rows_s(N) / N) / (rows_s(N0) / N0): 1.0 is linear scaling. Points without a rate
    (failed runs) get no efficiency and are never the baseline.
    """
    measured = sorted((n, r) for n, r in points if r is not None and r > 0)
    if not measured:
        return {}
    n0, r0 = measured[0]
    return {n: (r / n) / (r0 / n0) for n, r in measured}


def expert_placement(folder: Path, ranks: int) -> dict[str, Any]:
    """Expert parameters of a MoE model folder and their FSDP2 share per rank (built on meta)."""
    from dllm_models import build_model

    raw = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):
        model = build_model(raw)
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    return {"experts": MOE_PLACEMENT, "num_experts": raw.get("num_experts"),
            "experts_per_token": raw.get("num_experts_per_tok"), "expert_params": expert, "total_params": total,
            "expert_gib_per_rank_bf16": round(expert * 2 / ranks / 2**30, 3)}


def train_row(recs: list[dict[str, Any]], line_times: Sequence[float], cfg: dict[str, Any],
              gpus: int) -> dict[str, Any]:
    """Step time, its parts, generated tokens/s (total and per GPU), peak memory and rows/s of one run."""
    rows_per_step = int(cfg["rl"]["prompts_per_step"]) * int(cfg["rl"]["group_size"]) if cfg else None
    steps = step_seconds(line_times)
    used = steady_records(recs)
    row: dict[str, Any] = {"steps_done": len(recs), "rows_per_step": rows_per_step,
                           "rows_per_gpu": rows_per_step // gpus if rows_per_step else None,
                           "first_step_s_incl_startup": round(line_times[0], 1) if line_times else None,
                           "step_s": _mean(steps), "step_s_samples": [round(s, 2) for s in steps]}
    for k in (*PARTS, "update_passes", "response_length"):
        row[k] = _mean([float(r[k]) for r in used if k in r])
    parts = [sum(float(r.get(k, 0.0)) for k in PARTS) for r in used]
    row["parts_s"] = _mean(parts)
    tok_s = [float(r["response_length"]) * rows_per_step / float(r["rollout_s"])
             for r in used if rows_per_step and r.get("rollout_s") and "response_length" in r]
    row["gen_tok_s"] = _mean(tok_s)
    row["gen_tok_s_per_gpu"] = row["gen_tok_s"] / gpus if row["gen_tok_s"] is not None else None
    row["peak_gib"] = max((float(r["peak_gib"]) for r in recs if "peak_gib" in r), default=None)
    step = row["step_s"]
    row["rows_s"] = rows_per_step / step if rows_per_step and step else None
    return row


# ----------------------------------------------------------------------------- runs


def ray_overrides(recipe: str, gpus: int, tiny: bool) -> list[str]:
    """The Ray fields of the command: N ranks, one GPU each (NCCL), or CPU ranks (gloo) when tiny.

    Tiny runs also take smaller batches (groups of 4, 2 Monte-Carlo masks where the algorithm has
    them), so that the CPU smoke run finishes in minutes. e2e_gpu's `train_overrides` has already
    shortened the responses.
    """
    words = ["trainer.backend=ray", f"trainer.num_workers={gpus}", f"trainer.gpus_per_worker={0 if tiny else 1}"]
    if tiny:
        from dare.recipes import get_recipe

        words += ["trainer.num_threads=1", "rl.group_size=4"]  # driver threads; each CPU rank takes one
        if hasattr(get_recipe(recipe).algorithm, "mc_num"):
            words.append("algorithm.mc_num=2")
    return words


def run_point(recipe: str, folder: Path, gpus: int, prompts_per_gpu: int, data: str,
              args: argparse.Namespace, env: dict[str, str], work: Path) -> dict[str, Any]:
    """One `dare train <recipe> ... trainer.backend=ray trainer.num_workers=gpus` run and its row."""
    key = f"{recipe}-x{gpus}"
    out = work / "runs" / key
    if out.exists():
        shutil.rmtree(out)
    spec = RunSpec("rl", recipe, folder.name)
    words = argparse.Namespace(prompts=gpus * prompts_per_gpu, tiny=args.tiny,
                               set=[*ray_overrides(recipe, gpus, args.tiny), *args.set])
    cmd = [sys.executable, str(REPO / "apps" / "dare"), "train", recipe, f"checkpoint.checkpoint={folder}",
           f"data.train_files={data}", *e2e_gpu.train_overrides(spec, words, args.steps),
           "--output-dir", str(out), "--no-progress"]
    print(f"\n=== {key}: {' '.join(cmd[1:])}", flush=True)
    f = run_command(cmd, env, args.timeout, work / "logs" / key, out / "metrics.jsonl", args.max_rss_gib)
    cfg = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    row: dict[str, Any] = {"run": key, "recipe": recipe, "model": folder.name, "gpus": gpus,
                           "prompts_per_gpu": prompts_per_gpu, "status": status_of(f), "rc": f.rc,
                           "wall_s": round(f.wall_s, 1), "command": " ".join(["python3", *cmd[1:]])}
    if cfg:
        row.update(group_size=cfg["rl"]["group_size"], max_new_tokens=cfg["rollout"]["max_new_tokens"])
    row.update(train_row(read_jsonl(out / "metrics.jsonl"), f.line_times, cfg, gpus))
    row["host_peak_gib"] = round(f.peak_rss_gib, 2) if f.peak_rss_gib is not None else None
    if row["status"] != "ok":
        row["stderr_tail"] = tail(f.stderr)
    if not args.keep_outputs:  # checkpoints (weights + optimizer state) and model/ exports fill the disk
        for sub in ("checkpoints", "model"):
            shutil.rmtree(out / sub, ignore_errors=True)
    return row


def add_efficiency(rows: list[dict[str, Any]]) -> None:
    """Fill `efficiency` of the curve rows (not the MoE row) from their rows/s."""
    curve = [r for r in rows if not r.get("moe")]
    eff = scaling_efficiency([(int(r["gpus"]), r.get("rows_s")) for r in curve])
    for r in curve:
        r["efficiency"] = eff.get(int(r["gpus"]))


# ----------------------------------------------------------------------------- output


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n" + "=" * 118)
    print(f"{'run':28s} {'status':8s} {'GPUs':>4s} {'rows':>5s} {'s/step':>8s} {'rollout':>8s} {'old':>7s} "
          f"{'ref':>7s} {'update':>7s} {'tok/s':>8s} {'tok/s/GPU':>9s} {'peak GiB':>8s} {'host GiB':>8s} "
          f"{'rows/s':>7s} {'eff':>5s}")
    for r in rows:
        print(f"{r['run']:28s} {r['status']:8s} {r['gpus']:>4d} {_fmt(r.get('rows_per_step')):>5s} "
              f"{_fmt(r.get('step_s'), 2):>8s} {_fmt(r.get('rollout_s'), 2):>8s} {_fmt(r.get('old_s'), 2):>7s} "
              f"{_fmt(r.get('reference_s'), 2):>7s} {_fmt(r.get('update_s'), 2):>7s} {_fmt(r.get('gen_tok_s')):>8s} "
              f"{_fmt(r.get('gen_tok_s_per_gpu')):>9s} {_fmt(r.get('peak_gib'), 2):>8s} "
              f"{_fmt(r.get('host_peak_gib'), 2):>8s} {_fmt(r.get('rows_s'), 3):>7s} {_fmt(r.get('efficiency'), 2):>5s}")
        if r.get("moe"):
            print(f"   experts: {r['experts']}; {r['num_experts']} experts, top-{r['experts_per_token']}, "
                  f"{r['expert_params'] / 1e6:,.1f} M expert parameters of {r['total_params'] / 1e6:,.1f} M, "
                  f"{r['expert_gib_per_rank_bf16']} GiB (bf16) of them per rank")
        if r.get("stderr_tail"):
            print("   stderr (last lines):\n      " + r["stderr_tail"].replace("\n", "\n      "))
    print("s/step: mean wall s of the steps after the first (and before the last, which gathers the weights);"
          " parts: ranks' mean s; tok/s: response tokens / rollout_s; peak: max over ranks and steps;"
          " eff: (rows/s / N) / (rows/s / N at the smallest N)")


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curve", default=None, help="GPU counts of the curve, comma-separated "
                    "(default 1,2,4,8; tiny 1,2); empty: no curve")
    ap.add_argument("--prompts-per-gpu", type=int, default=1, help="rl.prompts_per_step = N x this")
    ap.add_argument("--steps", type=int, default=3, help="trainer.max_steps (3: one steady step between the "
                    "first and the last)")
    ap.add_argument("--recipe", default="sdar-bgpo")
    ap.add_argument("--model", default="SDAR-8B-Chat", help="release folder of --checkpoints")
    ap.add_argument("--moe", action="store_true", help="also run the MoE row")
    ap.add_argument("--moe-gpus", type=int, default=None, help="ranks of the MoE row (default 8; tiny 2)")
    ap.add_argument("--moe-recipe", default="sdar_moe-cj-grpo")
    ap.add_argument("--moe-model", default="SDAR-30B-A3B-Chat")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="dotted overrides for every run")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], metavar="JSON",
                    help="rows of earlier scale_out.json files (other points) to add to the table and efficiency")
    ap.add_argument("--tiny", action="store_true", help="toy shapes on CPU Ray ranks (gloo) in a temporary folder "
                    "(removed at the end)")
    e2e_gpu.add_machine_options(ap, name="scale_out", tiny_rss_gib=12)
    args = ap.parse_args(argv)
    curve = args.curve if args.curve is not None else ("1,2" if args.tiny else "1,2,4,8")
    args.curve = [int(x) for x in curve.split(",") if x.strip()]
    args.moe_gpus = args.moe_gpus or (2 if args.tiny else 8)
    if args.max_rss_gib is None:
        args.max_rss_gib = 12.0 if args.tiny else 0.0  # the tiny MoE row: ~7.5 GiB over 2 ranks
    if args.steps < 1 or args.prompts_per_gpu < 1 or any(n < 1 for n in args.curve) or args.moe_gpus < 1:
        ap.error("--steps, --prompts-per-gpu, --moe-gpus and every --curve point must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoints = args.checkpoints or e2e_gpu._default_dir("checkpoints")
    data_dir = args.data or e2e_gpu._default_dir("data")
    if args.prepare_devshare is not None:
        e2e_gpu.prepare_devshare(checkpoints, data_dir, args.prepare_devshare, [args.model, args.moe_model])
        return 0
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    temp = args.tiny and args.workdir is None
    work = args.workdir or (Path(tempfile.mkdtemp(prefix="scale_out-")) if args.tiny else REPO / ".bench" / "scale_out")
    work.mkdir(parents=True, exist_ok=True)
    env = {**RAY_ENV, **e2e_gpu.command_env(tiny=args.tiny)}
    print(f"device={device} tiny={args.tiny} curve={args.curve} moe={args.moe} workdir={work}", flush=True)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    try:
        rl_data, _ = e2e_gpu.write_data(data_dir if data_dir.is_dir() else None, work / "data", args.data_rows)
        jobs = [(args.recipe, args.model, n, False) for n in args.curve]
        jobs += [(args.moe_recipe, args.moe_model, args.moe_gpus, True)] if args.moe else []
        visible = torch.cuda.device_count() if device == "cuda" else 0
        for i, (recipe, model, gpus, moe) in enumerate(jobs):
            folder = work / "models" / model
            try:
                if not args.tiny and gpus > visible:  # Ray would wait for the GPUs until --timeout
                    raise RuntimeError(f"{gpus} GPUs needed, {visible} visible")
                if model not in models:
                    print(f"\n--- model folder {model}", flush=True)
                    models[model] = e2e_gpu.prepare_model(model, checkpoints, work / "models", tiny=args.tiny,
                                                          device=device)
                    print(f"    {models[model]}", flush=True)
                row = run_point(recipe, folder, gpus, args.prompts_per_gpu, rl_data, args, env, work)
            except Exception as err:  # a broken point is a row, not the end of the script
                import traceback

                row = {"run": f"{recipe}-x{gpus}", "recipe": recipe, "model": model, "gpus": gpus, "status": "error",
                       "error": repr(err), "stderr_tail": tail(traceback.format_exc())}
            if moe:  # from the written folder's config (tiny: shrunk), else the release's
                config_dir = folder if (folder / "config.json").is_file() else checkpoints / model
                row.update(moe=True, **expert_placement(config_dir, gpus))
            rows.append(row)
            print(f"--- {row['run']}: {row['status']} ({_fmt(row.get('wall_s'))} s)", flush=True)
            if all(m != model for _, m, _, _ in jobs[i + 1:]) and not args.keep_models and not args.tiny:
                shutil.rmtree(folder, ignore_errors=True)  # 16 GB (8B) / 61 GB (30B-A3B); the disk holds few
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)
    for path in args.merge:  # other commands' points; a point measured here wins
        have = {(bool(r.get("moe")), r["gpus"]) for r in rows}
        rows += [r for r in json.loads(path.read_text())["rows"]
                 if r.get("status") == "ok" and (bool(r.get("moe")), r["gpus"]) not in have]
    rows.sort(key=lambda r: (bool(r.get("moe")), int(r["gpus"])))
    add_efficiency(rows)
    print_table(rows)
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "tiny": args.tiny,
              "gpu_count": torch.cuda.device_count() if device == "cuda" else 0, "steps": args.steps,
              "prompts_per_gpu": args.prompts_per_gpu, "set": args.set, "models": models, "rows": rows,
              "total_s": round(time.perf_counter() - t0, 1)}
    target = args.json or (Path(os.environ["OUT"]) / "scale_out.json" if os.environ.get("OUT") else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=2, default=str))
        print(f"rows written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

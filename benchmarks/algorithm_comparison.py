"""Every RL algorithm of a family on DARE's Sudoku and Countdown data, from one warm start (CPU).

For each task (sudoku, countdown) and family (llada and dream: masked diffusion, sdar: block
diffusion):

1. Build a small model from scratch over the 20-symbol task vocabulary (`comparison_tasks`).
2. SFT warm start on the training split (`dllm_algorithms.SFT`), checking greedy accuracy on
   `--num-val` held-out training rows every `--sft-check-every` steps and stopping at the first
   check at or above `--sft-target` (or at `--sft-max-steps`): the warm start sits where the
   SFT curve has started to rise, leaving RL room.
3. Greedy accuracy on the test split (dllm_eval's verifier on the decoded text).
4. For every algorithm defined for the family, plus a coin-flip-reward control, and every seed:
   `--steps` RL steps of `dllm_train.LocalRL` from a copy of the warm start (same prompts per
   seed for every algorithm: `--prompts` x `--group` samples at T = 1), then test accuracy again.
5. Print a table (mean +- std over seeds), write `<out>/<task>-<family>.json` and
   `<out>/<task>-<family>.png` (mean reward per step, every algorithm on one plot).

Decoding. LLaDA and Dream: one block of 16, 16 steps, low-confidence remasking (one token per
step). SDAR: block diffusion on the global grid of 4 (the 16-token prompt is 4 blocks, the
response 4 more), 4 steps per block. Evaluation is greedy (T = 0); rollouts sample at T = 1.

Rollout sampler (`--sampler`). `fixed` (the default, the rows measured before issue 35) decodes
every rollout with the rule above. `dare` takes the rollout rule of DARE's recipe for the family
and algorithm (`dare show <family>-<algorithm>`: `remasking`, `threshold`, `top_k`, `top_p`,
`commit_block_start`, `alg_temp`), e.g. SDAR BGPO's threshold rule at 0.9 with at least one token
per step, Dream's entropy rule with top-p 0.95. The grid (block length and steps), the
temperature (1) and greedy evaluation stay the benchmark's, so the two samplers differ only in
the rule; a run's table label carries "[dare sampler]".

    uv run python benchmarks/algorithm_comparison.py --tiny                      # smoke (~2 min)
    uv run python benchmarks/algorithm_comparison.py --task sudoku --family llada \
        --algorithms d1,cj-grpo --seeds 3 --steps 40 --num-test 0               # a reduced run
    uv run python benchmarks/algorithm_comparison.py                            # everything
    python3 benchmarks/algorithm_comparison.py --device cuda ...                # on a GPU (not yet measured)

Variants. An entry of `--algorithms` may carry settings in brackets, and is named by them in the
table: `d1[prompt_mask_prob=0]`, `dmpo[baseline=group,num_iterations=1]`, `spg[optim.lr=6.67e-5]`.
A plain key is a field of the algorithm's class (replacing the budget below), `optim.<field>` a
field of `dllm_train.OptimConfig`, and `task=<task>` applies the `algorithm.*` settings of DARE's
recipe scripts for that task (`dare.recipes.task_settings`; the batch's group size and lengths
stay the benchmark's). Every value goes through the class's own validation.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import json
import statistics
import time
import zlib
from pathlib import Path
from typing import Any

import torch

from comparison_tasks import RESPONSE_LEN, SPLITS, TASKS, TaskData, build_tokenizer, read_rows, reward, verify
from dare.algorithms import ALGORITHMS, get_algorithm
from dare.recipes import RECIPES, get_recipe, task_settings
from dllm_models import build_model
from dllm_rollout import SamplingConfig, decode, left_pad
from dllm_algorithms import SFT
from dllm_train import LocalRL, OptimConfig, PromptBatch, SFTConfig, TrainerConfig, derive_seed, generator

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "data" / "rl"
TINY_DATA = HERE / "data"
FAMILIES = ("llada", "sdar", "dream")
SAMPLERS = ("fixed", "dare")
# the decoding-rule fields of a recipe's `rollout` that `--sampler dare` takes (the grid, temperature, cache and
# EOS accounting stay the benchmark's)
RULE_FIELDS = ("remasking", "threshold", "top_k", "top_p", "commit_block_start", "alg_temp")
CONTROL = "cj-grpo"  # the control's algorithm: defined for both families, cheap
# Monte-Carlo budgets / iterations reduced so every algorithm's step costs a few forwards
# (the same for every seed, task and family)
BUDGET: dict[str, dict[str, Any]] = {
    "bgpo": {"mc_num": 4}, "ebpo": {"mc_num": 4}, "espo": {"mc_num": 2, "num_iterations": 2},
    "mdpo": {"top_k_steps": 2}, "d-treerpo": {"trees": 4, "branching": 2, "depth": 2, "num_iterations": 2},
    "gdpo": {"num_iterations": 2, "clip_low": 0.5, "clip_high": 0.5}, "tracerl": {"shrink": 2},
}
SAMPLING_CHANGES: dict[str, dict[str, Any]] = {"justgrpo": {"block_length": 1}}  # JustGRPO decodes left to right
# SDAR at 1e-3 stays near 0 % for hundreds of steps; Dream's lr was set by a probe (docs/benchmarks.md)
SFT_LR = {"llada": 1e-3, "sdar": 3e-3, "dream": 1e-3}
_SHAPE: dict[str, Any] = {"rope_theta": 10000.0, "torch_dtype": "float32"}


def build(family: str, tok: Any, seed: int = 0) -> Any:
    """A fresh model: width 128, 4 layers, 4 heads, MLP 384 (the quick start's size); SDAR block 4; SDAR
    and Dream 2 KV heads of 32."""
    ids = {"vocab_size": len(tok), "mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id}
    if family == "llada":
        raw = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 128, "n_layers": 4,
               "n_heads": 4, "n_kv_heads": 4, "mlp_hidden_size": 384, "embedding_size": len(tok),
               "rms_norm_eps": 1e-5, "max_sequence_length": 64, **_SHAPE, **ids}
    elif family == "dream":
        raw = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 384, "rms_norm_eps": 1e-5,
               "max_position_embeddings": 64, "tie_word_embeddings": False, **_SHAPE, **ids}
    else:
        raw = {"model_type": "sdar", "architectures": ["SDARForCausalLM"], "hidden_size": 128,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
               "intermediate_size": 384, "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "block_size": 4,
               **_SHAPE, **ids}
    model = build_model(raw)
    model.reset_parameters(generator=generator(seed, "init"), std=0.02)  # type: ignore[operator]
    return model


def sampling(family: str, *, temperature: float) -> SamplingConfig:
    """The decoding of the module docstring (record_trajectory for the algorithms that replay it)."""
    block = family == "sdar"
    return SamplingConfig(max_new_tokens=RESPONSE_LEN, steps=4 if block else RESPONSE_LEN,
                          block_length=4 if block else RESPONSE_LEN, temperature=temperature,
                          block_diffusion=block, record_trajectory=temperature > 0)


def dare_rule(family: str, algorithm: str) -> dict[str, Any]:
    """The decoding rule (`RULE_FIELDS`) of DARE's recipe `<family>-<algorithm>`, as `dare show` resolves it."""
    name = f"{family}-{algorithm}"
    if name not in RECIPES:
        raise ValueError(f"--sampler dare: no recipe {name!r} gives {algorithm}'s rollout rule on {family}; "
                         f"use --sampler fixed or an algorithm with a {family} recipe (`dare recipes`)")
    rollout = get_recipe(name).rollout  # type: ignore[attr-defined]
    return {k: getattr(rollout, k) for k in RULE_FIELDS}


def rollout_sampling(family: str, algorithm: str, sampler: str) -> SamplingConfig:
    """The rollouts' decoding: the benchmark's grid at T = 1, with the recipe's rule under `--sampler dare`."""
    if sampler not in SAMPLERS:
        raise ValueError(f"--sampler {sampler!r} unknown; choose one of {SAMPLERS}")
    rule = dare_rule(family, algorithm) if sampler == "dare" else {}
    return dataclasses.replace(sampling(family, temperature=1.0), **rule, **SAMPLING_CHANGES.get(algorithm, {}))


def accuracy(model: Any, data: TaskData, rows: list[Any], family: str, batch: int = 256) -> float:
    """Greedy accuracy (dllm_eval's `acc`) on `rows`."""
    greedy = sampling(family, temperature=0.0)
    was_training = model.training
    model.eval()
    hits = 0.0
    for i in range(0, len(rows), batch):
        chunk = rows[i: i + batch]
        ids, mask = left_pad([data.prompt_ids(r) for r in chunk], model.traits.pad_token_id)
        dev = next(model.parameters()).device
        with torch.no_grad():
            out = decode(model, ids.to(dev), mask.to(dev), torch.zeros(len(chunk), dtype=torch.long, device=dev), greedy)
        for r, resp in zip(chunk, out.response_ids.tolist()):
            hits += verify(data.detokenize(resp), r.key())[1]
    model.train(was_training)
    return hits / max(len(rows), 1)


def warm_start(data: TaskData, family: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """(model after SFT, record): SFT until held-out training accuracy first reaches the target."""
    model = build(family, data.tok).to(args.device)
    lr = args.sft_lr or SFT_LR[family]
    optim = OptimConfig(lr=lr, warmup_steps=min(50, args.sft_max_steps // 4), grad_clip=1.0)

    def batch(step: int) -> tuple[torch.Tensor, ...]:
        return tuple(t.to(args.device) for t in data.sft_batch(args.sft_batch, derive_seed(0, "sft-data", step)))

    sft = SFT(sft=SFTConfig(steps=args.sft_max_steps, batch_size=args.sft_batch)).worker(
        model, batch, optim, steps=args.sft_max_steps, seed=0)
    curve: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    step = 0
    while step < args.sft_max_steps:
        sft.step(step)
        step += 1
        if step % args.sft_check_every == 0 or step == args.sft_max_steps:
            curve.append((step, accuracy(model, data, data.val, family)))
            print(f"  sft {step:5d}: held-out train accuracy {100 * curve[-1][1]:5.1f} %", flush=True)
            if curve[-1][1] >= args.sft_target:
                break
    return model, {"sft_steps": step, "sft_lr": lr, "sft_curve": curve,
                   "sft_seconds": time.perf_counter() - t0}


def coin_flip(text: str, key: str) -> float:
    """A reward with the task's spread but no information about correctness."""
    return float(zlib.crc32(text.encode()) % 2)


def split_specs(text: str) -> list[str]:
    """`--algorithms` split at the commas outside brackets: "d1[a=1,b=2],spg" -> ["d1[a=1,b=2]", "spg"]."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [c for c in [*out, cur.strip()] if c]


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """("d1", {"prompt_mask_prob": 0}) of "d1[prompt_mask_prob=0]"; values are Python literals or strings."""
    base, bracket, rest = spec.partition("[")
    if not bracket:
        return spec, {}
    if not rest.endswith("]"):
        raise ValueError(f"--algorithms entry {spec!r}: expected name[key=value,...]")
    fields: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in rest[:-1].split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--algorithms entry {spec!r}: {item!r} is not key=value")
        try:
            fields[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            fields[key.strip()] = value.strip()
    return base.strip(), fields


def configure(spec: str, family: str, lr: float) -> tuple[Any, OptimConfig, dict[str, Any]]:
    """(algorithm, optimizer settings, every field set beyond the class defaults) of one `--algorithms` entry."""
    name, fields = parse_spec(spec)
    changes: dict[str, Any] = dict(BUDGET.get(name, {}))
    task = fields.pop("task", None)
    if task is not None:
        changes.update({k.removeprefix("algorithm."): v for k, v in task_settings(family, name, str(task)).items()
                        if k.startswith("algorithm.")})
    optim_changes = {k.removeprefix("optim."): v for k, v in fields.items() if k.startswith("optim.")}
    changes.update({k: v for k, v in fields.items() if not k.startswith("optim.")})
    alg = get_algorithm(name)
    for owner, names, given in (("algorithm " + name, {f.name for f in dataclasses.fields(alg)}, changes),
                                ("OptimConfig", {f.name for f in dataclasses.fields(OptimConfig)}, optim_changes)):
        bad = sorted(set(given) - names)
        if bad:
            raise ValueError(f"--algorithms entry {spec!r}: {bad} are not fields of {owner}; "
                             f"choose from {sorted(names)}")
    optim = dataclasses.replace(OptimConfig(lr=lr, grad_clip=1.0), **optim_changes)
    return (dataclasses.replace(alg, **changes), optim,  # type: ignore[type-var]
            {**changes, **{f"optim.{k}": v for k, v in optim_changes.items()}})


def rl_run(spec: str, warm: Any, data: TaskData, family: str, seed: int, args: argparse.Namespace, *,
           control: bool = False) -> dict[str, Any]:
    """`args.steps` RL steps of algorithm entry `spec` from a copy of `warm`; rewards, accuracy, time."""
    model = copy.deepcopy(warm)
    name = parse_spec(spec)[0]
    alg, optim, fields = configure(spec, family, args.lr)

    def prompts(step: int) -> PromptBatch:
        ids, keys = data.rl_prompts(args.prompts, derive_seed(seed, "rl-data", step))
        return PromptBatch(ids, keys, args.group)

    task_rewards: list[float] = []

    def control_reward(text: str, key: str) -> float:
        task_rewards.append(reward(text, key))  # logged, not trained on
        return coin_flip(text, key)

    rollout = rollout_sampling(family, name, args.sampler)
    rl = LocalRL(model, prompts=prompts, sampling=rollout,
                 reward_fn=control_reward if control else reward, detokenize=data.detokenize, algorithm=alg,
                 optim=optim,
                 trainer=TrainerConfig(max_steps=args.steps, seed=seed, consistency_every=0))
    t0 = time.perf_counter()
    rewards = []
    for step in range(args.steps):
        metrics = rl.step(step)
        # the control's curve shows the task reward of its samples, not the coin flips it trained on
        rewards.append(statistics.fmean(task_rewards) if control else metrics["reward_mean"])
        task_rewards.clear()
    seconds = time.perf_counter() - t0
    return {"seed": seed, "fields": fields, "lr": optim.lr, "rewards": rewards, "seconds": seconds,
            "sampling": {k: getattr(rollout, k) for k in ("steps", "block_length", "temperature", *RULE_FIELDS)},
            "after": accuracy(model, data, data.test, family)}


def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def plot(path: Path, title: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Mean reward per RL step over seeds (shaded: +- std), every algorithm on one plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=90)
    for name, seeds in runs.items():
        curves = torch.tensor([s["rewards"] for s in seeds])
        m, sd = curves.mean(0), curves.std(0) if len(seeds) > 1 else torch.zeros(curves.shape[1])
        x = range(1, curves.shape[1] + 1)
        line = ax.plot(x, m, label=name, linestyle="--" if name.startswith("control") else "-")[0]
        ax.fill_between(x, m - sd, m + sd, color=line.get_color(), alpha=0.12)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward of the rollout (dllm_eval)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_pair(task: str, family: str, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Warm start, then every algorithm x seed and the control on one (task, family)."""
    root = Path(args.data)
    paths = ([root / f"{task}-{split}-tiny.parquet" for split in ("train", "test")] if args.tiny
             else [root / p for p in SPLITS[task]])
    data = TaskData(task, read_rows(paths[0]), read_rows(paths[1]), build_tokenizer(),
                    num_val=args.num_val, num_test=args.num_test)
    print(f"{task} / {family}: {len(data.sft_rows)} SFT rows, {len(data.rl_rows)} RL rows, "
          f"{len(data.val)} validation rows, {len(data.test)} test rows", flush=True)
    cache = Path(args.out) / f"{task}-{family}-warm.pt"
    if args.reuse_warm_start and cache.exists():
        warm, record = build(family, data.tok).to(args.device), json.loads(cache.with_suffix(".json").read_text())
        warm.load_state_dict(torch.load(cache, map_location=args.device))
    else:
        warm, record = warm_start(data, family, args)
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(warm.state_dict(), cache)
        cache.with_suffix(".json").write_text(json.dumps(record))
    before = accuracy(warm, data, data.test, family)
    print(f"  warm start: {record['sft_steps']} SFT steps, test accuracy {100 * before:.1f} %", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {}
    control = {"with": ["control"], "only": [], "none": []}[args.control]
    for name in (["control"] if args.control == "only" else [*names, *control]):
        label = f"control ({args.control_algorithm}, coin-flip reward)" if name == "control" else name
        label += " [dare sampler]" if args.sampler == "dare" else ""
        runs[label] = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = rl_run(args.control_algorithm if name == "control" else name, warm, data, family, seed, args,
                       control=name == "control")
            runs[label].append(r)
            print(f"  {label:34s} seed {seed}: {100 * before:5.1f} % -> {100 * r['after']:5.1f} %, "
                  f"reward {statistics.fmean(r['rewards'][:5]):.3f} -> {statistics.fmean(r['rewards'][-5:]):.3f}, "
                  f"{r['seconds']:.0f} s", flush=True)
            out = Path(args.out)  # written after every run: a stopped process keeps the seeds that finished
            out.mkdir(parents=True, exist_ok=True)
            result = {"task": task, "family": family, "before": before, "test_rows": len(data.test), **record,
                      "settings": {k: v for k, v in vars(args).items()}, "budget": BUDGET, "runs": runs}
            (out / f"{task}-{family}{args.tag}.json").write_text(json.dumps(result, indent=1))
    plot(out / f"{task}-{family}{args.tag}.png", plot_title(result), runs)
    return result


def plot_title(result: dict[str, Any]) -> str:
    s = result["settings"]
    seeds = max(len(v) for v in result["runs"].values())  # merged files: the seeds of the runs, not of one process
    return f"{result['task']}, {result['family']}: {s['prompts']}x{s['group']} samples/step, {seeds} seeds"


def merge(paths: list[str], out: Path) -> None:
    """One table and plot from result files of one (task, family) written by separate runs."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    first = results[0]
    for r in results[1:]:
        if (r["task"], r["family"], r["before"]) != (first["task"], first["family"], first["before"]):
            raise ValueError(f"{paths}: results of different tasks, families or warm starts cannot be merged")
        for label, seeds in r["runs"].items():  # the same entry split over processes by --first-seed: its seeds joined
            first["runs"].setdefault(label, []).extend(seeds)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{first['task']}-{first['family']}"
    (out / f"{name}.json").write_text(json.dumps(first, indent=1))
    plot(out / f"{name}.png", plot_title(first), first["runs"])
    print(table(first))


def table(result: dict[str, Any]) -> str:
    """The markdown table of one (task, family): accuracy before / after (mean +- std), rewards, time."""
    n = result["test_rows"]
    lines = [f"| algorithm | test accuracy before RL ({n}) | after RL, mean ± std | change | "
             "reward, first 5 steps | last 5 steps | wall s per run |", "|---|---|---|---|---|---|---|"]
    for label, seeds in result["runs"].items():
        after = mean_std([100 * s["after"] for s in seeds])
        first = statistics.fmean(statistics.fmean(s["rewards"][:5]) for s in seeds)
        last = statistics.fmean(statistics.fmean(s["rewards"][-5:]) for s in seeds)
        secs = statistics.fmean(s["seconds"] for s in seeds)
        b = 100 * result["before"]
        lines.append(f"| {label} | {b:.1f} % | {after[0]:.1f} ± {after[1]:.1f} % | {after[0] - b:+.1f} | "
                     f"{first:.3f} | {last:.3f} | {secs:.0f} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="all", help=f"one of {TASKS} or all")
    ap.add_argument("--family", default="all", help=f"one of {FAMILIES} or all")
    ap.add_argument("--algorithms", default=None, help="comma-separated (default: every one defined for the family); "
                    "an entry may carry settings: name[field=value,optim.lr=...,task=countdown] (see above)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per algorithm")
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--steps", type=int, default=60, help="RL steps per run")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per RL step")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--lr", type=float, default=1e-4, help="RL learning rate")
    ap.add_argument("--sft-target", type=float, default=0.25, help="stop SFT at this held-out training accuracy")
    ap.add_argument("--sft-max-steps", type=int, default=3000)
    ap.add_argument("--sft-check-every", type=int, default=50)
    ap.add_argument("--sft-batch", type=int, default=64)
    ap.add_argument("--sft-lr", type=float, default=None,
                    help=f"SFT learning rate (default: the family's, {SFT_LR}; a probe sets a new family's)")
    ap.add_argument("--num-val", type=int, default=200, help="training rows held out for the SFT stopping rule")
    ap.add_argument("--num-test", type=int, default=0, help="test rows evaluated (0: the full split)")
    ap.add_argument("--data", default=str(SHARED), help="folder with train/ and test/ DARE RL parquets")
    ap.add_argument("--out", default="runs/algorithm_comparison")
    ap.add_argument("--reuse-warm-start", action="store_true",
                    help="load <out>/<task>-<family>-warm.pt written by an earlier run with the same SFT settings")
    ap.add_argument("--control", choices=("with", "only", "none"), default="with",
                    help="run the coin-flip control after the algorithms, alone, or not")
    ap.add_argument("--control-algorithm", default=CONTROL, help="the algorithm the control trains with")
    ap.add_argument("--sampler", choices=SAMPLERS, default="fixed",
                    help="rollout rule: fixed (the grid's low-confidence rule, the rows before issue 35) or dare "
                    "(the rule of DARE's recipe <family>-<algorithm>: threshold, entropy, top-k / top-p; see above)")
    ap.add_argument("--tag", default="", help="suffix of the result files (runs split over processes)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="only merge result files of one task and family into <out>/<task>-<family>.{json,png}")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--device", default="cpu", help="where the models train and decode (cpu, cuda); a run's "
                    "numbers depend on it (kernels and random streams differ), so compare rows of one device")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke mode: the shipped subsets in benchmarks/data, one algorithm, 2 seeds, 2 steps")
    args = ap.parse_args(argv)
    if args.tiny:
        args.data, args.seeds, args.steps, args.prompts, args.group = str(TINY_DATA), 2, 2, 2, 4
        args.sft_max_steps, args.sft_check_every, args.sft_batch, args.num_val = 4, 2, 8, 8
        args.algorithms = args.algorithms or "cj-grpo"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.merge:
        merge(args.merge, Path(args.out))
        return
    torch.set_num_threads(args.threads)
    tasks = TASKS if args.task == "all" else (args.task,)
    families = FAMILIES if args.family == "all" else (args.family,)
    for task in tasks:
        for family in families:
            defined = sorted(n for n, e in ALGORITHMS.items() if family in e.families)
            names = split_specs(args.algorithms) if args.algorithms else defined
            bad = [n for n in names if parse_spec(n)[0] not in defined]
            if bad:
                raise ValueError(f"algorithms {bad} are not defined for family {family!r}; choose from {defined}")
            for n in names:  # a bad field or a missing recipe fails now, not after the runs before it
                configure(n, family, args.lr)
                rollout_sampling(family, parse_spec(n)[0], args.sampler)
            if args.control != "none":
                rollout_sampling(family, args.control_algorithm, args.sampler)
            t0 = time.perf_counter()
            result = run_pair(task, family, names, args)
            print(f"\n{task} / {family} (warm start: {result['sft_steps']} SFT steps at lr {result['sft_lr']:g}; "
                  f"{time.perf_counter() - t0:.0f} s in all)\n{table(result)}\n", flush=True)


if __name__ == "__main__":
    main()

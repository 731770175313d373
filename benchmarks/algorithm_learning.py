"""Does each RL algorithm raise held-out accuracy on the quick-start task? (CPU)

Starts every algorithm defined for a model family from the same warm start, runs N RL steps with
the quick start's rollout and batch shape, and prints greedy exact match on the 500 held-out
prompts before and after. `--family llada` (default): the quick start's model after its 300 SFT
steps (41.0 % held-out). `--family sdar` / `llada2`: a block-diffusion model of the same size
(block 4 = the 4-token answer), SFT-warmed by the same worker (BD3LM layout) with the steps and lr
of BLOCK_SFT, rolled out and evaluated with block diffusion (block 4, 4 steps per block).

    uv run python benchmarks/algorithm_learning.py --steps 60 [--algorithms d1,bgpo]
    uv run python benchmarks/algorithm_learning.py --family sdar --steps 60
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
import zlib
from typing import Any

import torch

from dare.algorithms import ALGORITHMS, check_family, get_algorithm
from dare.config import apply_overrides
from dare.quickstart import build_tiny_model, evaluate_accuracy
from dare.recipes import quickstart
from dare.tasks.addition import AdditionTask, build_tokenizer, exact_match_reward
from dllm_models import build_model
from dllm_rollout import SamplingConfig, decode, left_pad
from dllm_algorithms import SFT
from dllm_train import LocalRL, PromptBatch, derive_seed, generator

# Monte-Carlo budgets / iterations reduced so every algorithm's step costs a few forwards
BUDGET = {"bgpo": {"mc_num": 4}, "espo": {"mc_num": 2, "num_iterations": 2}, "mdpo": {"top_k_steps": 2},
          "d-treerpo": {"trees": 4, "branching": 2, "depth": 2, "num_iterations": 2}, 
          "ebpo": {"mc_num": 4}, "gdpo": {"num_iterations": 2}}
SAMPLING = {"justgrpo": {"block_length": 1}}
FAMILIES = ("llada", "sdar", "llada2")

# Block families at the quick start's size: width 128, 4 layers, 4 heads of 32 (2 KV heads), MLP 384,
# block 4 (the prompt is 2 blocks, the 4-token answer 1). LLaDA2 keeps its MoE layout, small:
# layer 0 dense, layers 1-3 with 4 experts of width 96 (top-2, one group) plus one shared expert.
_BLOCK_SHAPE = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "intermediate_size": 384, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 64, "torch_dtype": "float32"}
BLOCK_MODELS: dict[str, dict[str, Any]] = {
    "sdar": {"model_type": "sdar", "architectures": ["SDARForCausalLM"], "block_size": 4},
    "llada2": {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"], "block_length": 4,
               "moe_intermediate_size": 96, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
               "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0},
}
# SFT of the block warm starts, chosen (2026-11-30, one thread) so they land on the steep part of
# the SFT curve like LLaDA's 41.0 %. SDAR at the quick start's lr 1e-3 stays near 0 % for 500
# steps (24 % at 600, 82 % at 700); at lr 3e-3: 17 % at 300, 42 % at 320, 68 % at 400. LLaDA2 at
# lr 3e-3: 29 % at 240, 43 % at 260, 74 % at 280.
BLOCK_SFT = {"sdar": ["sft.steps=320", "sft_optim.lr=3e-3"], "llada2": ["sft.steps=260", "sft_optim.lr=3e-3"]}


def _coin_flip(text: str, answer: str) -> float:
    """A reward with the task's spread but no information about correctness."""
    return float(zlib.crc32(text.encode()) % 2)


def build_block_model(family: str, cfg: Any, tokenizer: Any) -> Any:
    """A `family` (sdar, llada2) model of BLOCK_MODELS' shape with the tokenizer's special ids."""
    raw = {**_BLOCK_SHAPE, **BLOCK_MODELS[family], "vocab_size": len(tokenizer),
           "mask_token_id": tokenizer.mask_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    model = build_model(raw)
    init = generator(cfg.trainer.seed, "init")
    model.reset_parameters(generator=init, std=cfg.model.init_std)  # type: ignore[operator]
    return model


def accuracy(model: Any, task: AdditionTask, cfg: Any) -> float:
    """Greedy exact match on the held-out pairs (block diffusion when `cfg.rollout.block_diffusion`).

    `evaluate_accuracy` always decodes with masked diffusion, so block models are evaluated here,
    with the same loop and the rollout's block and steps.
    """
    if not cfg.rollout.block_diffusion:
        return evaluate_accuracy(model, task, cfg)
    greedy = SamplingConfig(max_new_tokens=cfg.rollout.max_new_tokens, steps=cfg.rollout.steps,
                            block_length=cfg.rollout.block_length, temperature=0.0, block_diffusion=True)
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(task.eval_pairs), cfg.eval.batch_size):
        chunk = task.eval_pairs[i: i + cfg.eval.batch_size]
        ids, mask = left_pad([task.encode(task.prompt(a, b)) for a, b in chunk], model.traits.pad_token_id)
        with torch.no_grad():
            out = decode(model, ids, mask, torch.zeros(len(chunk), dtype=torch.long), greedy)
        for (a, b), row in zip(chunk, out.response_ids.tolist()):
            correct += int(exact_match_reward(task.tokenizer.decode(row), task.answer(a, b)) == 1.0)
    model.train(was_training)
    return correct / len(task.eval_pairs)


def warm_start(lr: float = 3e-5, family: str = "llada") -> tuple[Any, ...]:
    """(cfg, tokenizer, task, model after the SFT phase, its held-out accuracy).

    llada: the quick start's model and SFT phase. sdar / llada2: BLOCK_MODELS' model, the quick
    start's SFT phase with BLOCK_SFT's steps and lr, and its rollout with `block_diffusion=True`.
    Runs on one torch thread, like the quick start (`trainer.num_threads=1`): the SFT trajectory,
    hence the warm start's accuracy, depends on the reduction order of the thread count.
    """
    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is unknown; choose one of {FAMILIES}")
    block = family != "llada"
    extra = [*BLOCK_SFT[family], "rollout.block_diffusion=true"] if block else []
    cfg = apply_overrides(quickstart(), [f"rl_optim.lr={lr}", *extra])
    torch.set_num_threads(cfg.trainer.num_threads)
    tok = build_tokenizer()
    task = AdditionTask(cfg.task, tok)
    model = build_block_model(family, cfg, tok) if block else build_tiny_model(cfg, tok)
    sft = SFT(sft=cfg.sft).worker(model, lambda s: task.sft_batch(cfg.sft.batch_size, derive_seed(0, "sft-data", s)),
                                  cfg.sft_optim, steps=cfg.sft.steps, seed=0)
    for s in range(cfg.sft.steps):
        sft.step(s)
    return cfg, tok, task, model, accuracy(model, task, cfg)


def learning_run(name: str, warm: tuple[Any, ...], *, steps: int, control: bool = False) -> tuple[float, float, list[float], float]:
    """(accuracy before, after, per-step mean rewards, seconds per step) of `steps` RL steps of `name`."""
    cfg, tok, task, warm_model, before = warm
    torch.set_num_threads(1)

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(cfg.rl.prompts_per_step, derive_seed(0, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], cfg.rl.group_size)

    model = copy.deepcopy(warm_model)
    entry = dataclasses.replace(get_algorithm(name), **BUDGET.get(name, {}))  # type: ignore[type-var]
    wf = LocalRL(
        model, prompts=prompts, sampling=dataclasses.replace(cfg.rollout, **SAMPLING.get(name, {})),
        reward_fn=_coin_flip if control else exact_match_reward, detokenize=tok.decode,
        algorithm=entry, optim=cfg.rl_optim, trainer=dataclasses.replace(cfg.trainer, consistency_every=0),
    )
    t0 = time.perf_counter()
    rewards = [wf.step(step)["reward_mean"] for step in range(steps)]
    per_step = (time.perf_counter() - t0) / steps
    return before, accuracy(model, task, cfg), rewards, per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--control", action="store_true",
                    help="replace the reward by a coin flip keyed on the response text (no task signal): "
                         "what the same number of updates does without a reward signal")
    ap.add_argument("--family", choices=FAMILIES, default="llada")
    ap.add_argument("--algorithms", default=None, help="comma-separated (default: every one defined for --family)")
    args = ap.parse_args()
    names = args.algorithms or ",".join(sorted(n for n, e in ALGORITHMS.items() if args.family in e.families))
    for name in names.split(","):
        check_family(name, get_algorithm(name), args.family)
    torch.set_num_threads(1)
    warm = warm_start(args.lr, args.family)
    print(f"{args.family} warm start (SFT {warm[0].sft.steps} steps, lr {warm[0].sft_optim.lr:g}): "
          f"{100 * warm[4]:.1f} %", flush=True)
    print(f"{'algorithm':12s} {'before':>7s} {'after':>7s} {'reward first10':>15s} {'reward last10':>14s} {'s/step':>7s}")
    for name in names.split(","):
        before, after, rewards, per_step = learning_run(name, warm, steps=args.steps, control=args.control)
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        print(f"{name:12s} {100 * before:6.1f}% {100 * after:6.1f}% {first:15.3f} {last:14.3f} {per_step:7.2f}", flush=True)


if __name__ == "__main__":
    main()

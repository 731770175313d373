"""GDPO's registry entry: the recipe defaults of its authors' scripts (KevinRojas1499/GDPO at 1918683).

GDPO is not in DARE; every row cites the authors' code (`repo=`): gdpo/slurm_scripts/train.yaml (the
run config), gdpo/slurm_scripts/countdown_base.sbatch (the launch script, the same for every dataset),
gdpo/gdpo_config.py (the trainer's defaults the config leaves) and gdpo/likelihood_estimators.py. The
authors train LLaDA-8B-Instruct only: the rollout rows are LLaDA's; Dream keeps its family's rollout.
"""

from __future__ import annotations

from dare.algorithms.dream_rollout import dream_rollout_as
from dare.algorithms.entry import Default, RLEntry
from dllm_algorithms import GDPO

GDPO_REPO = "KevinRojas1499/GDPO@1918683"
"""The authors' public code the rows point into."""

_YAML = "gdpo/slurm_scripts/train.yaml"
_SBATCH = "gdpo/slurm_scripts/countdown_base.sbatch"


def _gdpo(key: str, value: object, source: str, quote: str, *families: str) -> Default:
    return Default(key=key, value=value, dare=source, quote=quote, families=families, repo=GDPO_REPO)


def _ours(key: str, value: object, reason: str, *families: str) -> Default:
    return Default(key=key, value=value, reason=reason, families=families)


GDPO_DEFAULTS = (
    _gdpo("algorithm.rule", "gauss-3", f"{_SBATCH}:21", 'ESTIMATOR="${ESTIMATOR:-gauss-3}" # Options: mc, gauss-(1-5)'),
    _gdpo("algorithm.mc_samples", 1, "gdpo/likelihood_estimators.py:239",
          "def get_log_likelihood(self, model, seq, ..., num_batches=1, mc_batch_size=1, ...)"),
    _gdpo("algorithm.num_iterations", 12, f"{_SBATCH}:23", "NUM_ITER=12"),
    _gdpo("algorithm.clip_low", 0.5, f"{_YAML}:72", "epsilon: 0.5"),
    _gdpo("algorithm.clip_high", 0.5, f"{_YAML}:72", "epsilon: 0.5"),
    _gdpo("algorithm.kl_coef", 0.0, f"{_YAML}:71", "beta: 0.00"),
    _gdpo("rl.group_size", 6, f"{_YAML}:37", "num_generations: 6"),
    _ours("rl.prompts_per_step", 2, f"{GDPO_REPO} {_YAML}:41-42: 6 completions per device (one prompt's group) and "
          "2 gradient-accumulation steps on one process (gdpo/accelerate.yaml:19, num_processes: 1): each rollout "
          "batch holds 2 prompts, reused for the 12 iterations"),
    _gdpo("rl_optim.lr", 3e-7, f"{_YAML}:34", "learning_rate: 3e-7"),
    _gdpo("rl_optim.betas", (0.9, 0.99), f"{_YAML}:23-24", "adam_beta1: 0.9 / adam_beta2: 0.99"),
    _gdpo("rl_optim.weight_decay", 0.1, f"{_YAML}:25", "weight_decay: 0.1"),
    _gdpo("rl_optim.grad_clip", 0.2, f"{_YAML}:26", "max_grad_norm: 0.2"),
    _ours("rl_optim.warmup_steps", 2, f"{GDPO_REPO} {_YAML}:32,60: warmup_ratio 0.0001 of max_steps 15000, which "
          "transformers rounds up to ceil(1.5) = 2 optimizer steps"),
    _gdpo("checkpoint.lora_rank", 128, f"{_YAML}:10", "lora_r: 128"),
    _gdpo("checkpoint.lora_alpha", 64.0, f"{_YAML}:11", "lora_alpha: 64"),
    _gdpo("checkpoint.lora_dropout", 0.05, f"{_YAML}:12", "lora_dropout: 0.05"),
    _gdpo("data.max_prompt_length", 200, f"{_YAML}:64", "max_prompt_length: 200", "llada"),
    _gdpo("rollout.max_new_tokens", 256, f"{_YAML}:63", "max_completion_length: 256", "llada"),
    _gdpo("rollout.block_length", 32, f"{_YAML}:65", "block_length: 32", "llada"),
    _gdpo("rollout.steps", 128, f"{_YAML}:66", "diffusion_steps: 128", "llada"),
    _gdpo("rollout.remasking", "low_confidence", f"{_YAML}:68", "remasking: low_confidence", "llada"),
    _gdpo("rollout.temperature", 0.9, "gdpo/gdpo_config.py:193-194", "temperature: float = field( default=0.9,",
          "llada"),
    # Dream: the authors have no Dream run, so Dream's RL rollout as DARE runs it (as every Dream recipe here)
    *dream_rollout_as("GDPO's authors run LLaDA only: DARE's Dream rollout"),
)

GDPO_ENTRY = RLEntry(name="gdpo", algorithm=GDPO(), paper="Rojas et al., arXiv 2510.08554", defaults=GDPO_DEFAULTS)
"""`algorithm=gdpo`, the recipes `llada-gdpo` and `dream-gdpo` (one setting for every task: the authors'
script changes only the dataset, countdown_base.sbatch:20)."""

__all__ = ["GDPO_DEFAULTS", "GDPO_ENTRY", "GDPO_REPO"]

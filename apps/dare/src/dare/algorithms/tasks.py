"""Per-task settings of DARE's RL recipe scripts (`task=math|code|countdown|sudoku`), as `TaskOverrides`.

Each built-in entry picks one of these; docs/algorithms.md#per-task-settings cites the scripts, and
`tests/dare/test_task_settings.py` checks the values.
"""

from __future__ import annotations

from collections.abc import Mapping

from dare.algorithms.entry import TaskOverrides
from dllm_models import family_kind

TASKS = ("math", "code", "countdown", "sudoku")
"""The tasks of DARE's RL recipe scripts (`--task`), selectable with `task=<task>`."""

# masked families: prompt length, response length, decoding steps (DARE's shared task block,
# recipe/llada/run_d1_llada_8b_instruct.sh:87-115 and the same block in each script)
MASKED_LENGTHS = {"math": (512, 512, 256), "code": (1024, 512, 512), "countdown": (512, 256, 128),
                  "sudoku": (512, 256, 128)}
# CJ-GRPO's own blocks (recipe/{llada,dream}/run_cj_grpo_*.sh:87-115)
CJ_LENGTHS = {"llada": {"math": (512, 256, 128), "code": (512, 256, 256), "countdown": (512, 256, 128),
                        "sudoku": (512, 256, 128)},
              "dream": {"math": (512, 256, 128), "code": (1024, 512, 512), "countdown": (512, 256, 128),
                        "sudoku": (512, 256, 128)}}
# ESPO: KL beta, clip, group size (recipe/llada/run_espo_llada_8b_instruct.sh:184-224)
ESPO_TASKS = {"math": (0.001, 0.2, 16), "code": (0.01, 0.2, 10), "countdown": (0.003, 0.0, 6),
              "sudoku": (0.01, 0.2, 6)}


def _lengths(table: Mapping[str, tuple[int, int, int]], task: str, *, one_token_steps: bool) -> dict[str, object]:
    prompt, response, steps = table[task]
    return {"data.max_prompt_length": prompt, "rollout.max_new_tokens": response,
            "rollout.steps": response if one_token_steps else steps}


def _block(family: str, task: str) -> dict[str, object]:
    """SDAR and LLaDA2 scripts: responses of 2048 for every task, prompts of 1024 for code. (LLaDA2 BGPO/EBPO
    pass steps = R/2, R for code, per block to LLaDA2's generate: one token for each of a block's first 32
    steps either way, so the recipes' steps=32 holds for every task.)"""
    if family not in ("sdar", "llada2"):  # no DARE RL script (SDAR-MoE)
        return {}
    return {"data.max_prompt_length": 1024 if task == "code" else 512}


def grpo_style(*, one_token_steps: bool = False) -> TaskOverrides:
    """The shared task block of the masked scripts; the block families' prompt lengths."""
    def overrides(family: str, task: str) -> Mapping[str, object]:
        if family_kind(family) == "block":
            return _block(family, task)
        return _lengths(MASKED_LENGTHS, task, one_token_steps=one_token_steps)
    return overrides


def cj_grpo(family: str, task: str) -> Mapping[str, object]:
    """CJ-GRPO's own length blocks on LLaDA and Dream; the block families' prompt lengths."""
    if family_kind(family) == "block":
        return _block(family, task)
    return _lengths(CJ_LENGTHS[family], task, one_token_steps=False)


def espo(family: str, task: str) -> Mapping[str, object]:
    """The shared lengths plus ESPO's per-task KL beta, clip and group size."""
    beta, clip, group = ESPO_TASKS[task]
    return {**_lengths(MASKED_LENGTHS, task, one_token_steps=False), "algorithm.kl_coef": beta,
            "algorithm.clip_low": clip, "algorithm.clip_high": clip, "rl.group_size": group}


def check_task(task: str) -> None:
    """Raise unless `task` is one of `TASKS`."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; choose one of {', '.join(TASKS)}")


__all__ = ["TASKS", "check_task", "cj_grpo", "espo", "grpo_style"]

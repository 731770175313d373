"""`task=<task>` on an RL recipe: the settings DARE's recipe scripts change per task (yjyddq/DARE at
83ae8a3: recipe/llada/run_espo_llada_8b_instruct.sh:184-224, recipe/llada/run_d1_llada_8b_instruct.sh:87-115,
recipe/llada/run_cj_grpo_llada_8b_instruct.sh:87-115, recipe/llada/run_justgrpo_llada_8b_instruct.sh:139-167,
recipe/sdar/run_bgpo_sdar_8b_chat.sh:172-198,
recipe/llada2_mini/run_bgpo_llada2_mini.sh:92-120; docs/algorithms.md#per-task-settings)."""

from __future__ import annotations

import pytest

from dare.cli import main
from dare.recipes import RECIPES, TASKS, get_recipe, resolve

# DARE's ESPO script: task -> (KL beta, clip, group size), and the masked families' lengths
ESPO = {"math": (0.001, 0.2, 16), "code": (0.01, 0.2, 10), "countdown": (0.003, 0.0, 6), "sudoku": (0.01, 0.2, 6)}
LENGTHS = {"math": (512, 512, 256), "code": (1024, 512, 512), "countdown": (512, 256, 128), "sudoku": (512, 256, 128)}


@pytest.mark.parametrize("task", TASKS)
def test_espo_takes_dares_per_task_values(task: str) -> None:
    cfg = resolve(get_recipe("llada-espo"), [f"task={task}"])
    beta, clip, group = ESPO[task]
    assert (cfg.algorithm.kl_coef, cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (beta, clip, clip)
    assert cfg.rl is not None and cfg.rl.group_size == group
    assert cfg.data is not None and cfg.rollout is not None
    assert (cfg.data.max_prompt_length, cfg.rollout.max_new_tokens, cfg.rollout.steps) == LENGTHS[task]
    assert cfg.recipe == f"llada-espo-{task}"


def test_lengths_follow_the_algorithms_script() -> None:
    just = resolve(get_recipe("llada-justgrpo"), ["task=countdown"])
    assert just.rollout is not None and (just.rollout.max_new_tokens, just.rollout.steps) == (256, 256)
    cj = resolve(get_recipe("llada-cj-grpo"), ["task=code"])
    assert cj.data is not None and cj.rollout is not None
    assert (cj.data.max_prompt_length, cj.rollout.max_new_tokens, cj.rollout.steps) == (512, 256, 256)
    sdar = resolve(get_recipe("sdar-bgpo"), ["task=code"])
    assert sdar.data is not None and sdar.rollout is not None
    assert (sdar.data.max_prompt_length, sdar.rollout.max_new_tokens) == (1024, get_recipe("sdar-bgpo").rollout.max_new_tokens)  # type: ignore[union-attr]
    llada2 = resolve(get_recipe("llada2-ebpo"), ["task=code"])
    assert llada2.data is not None and llada2.rollout is not None
    assert (llada2.data.max_prompt_length, llada2.rollout.steps) == (1024, 32)
    # DARE passes steps = R/2 (R for code) per block to LLaDA2's generate, whose quota is then one token for
    # each of a block's first 32 steps: 32 steps per block for every task (test_dare_rollouts.py)
    assert resolve(get_recipe("llada2-ebpo"), ["task=sudoku"]).rollout.steps == 32  # type: ignore[union-attr]
    tree = get_recipe("llada-d-treerpo")  # one setting for every task in DARE's d-TreeRPO script
    assert resolve(tree, ["task=sudoku"]).rollout == tree.rollout


def test_every_rl_recipe_accepts_every_task() -> None:
    for name, build in RECIPES.items():
        cfg = build()
        if name == "quickstart" or cfg.kind != "rl":
            continue
        for task in TASKS:
            assert resolve(cfg, [f"task={task}"]).recipe == f"{name}-{task}"


def test_explicit_overrides_win_and_an_algorithm_switch_gets_its_own_task_values() -> None:
    cfg = resolve(get_recipe("llada-espo"), ["rl.group_size=4", "task=countdown"])
    assert cfg.rl is not None and cfg.rl.group_size == 4 and cfg.algorithm.kl_coef == 0.003
    switched = resolve(get_recipe("llada-d1"), ["algorithm=espo", "task=countdown"])
    assert switched.algorithm_name == "espo" and switched.algorithm.kl_coef == 0.003
    assert switched.algorithm.clip_low == 0.0


def test_show_prints_the_task_values_and_unknown_tasks_get_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "llada-espo", "task=countdown"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.kl_coef = 0.003" in out and "rl.group_size = 6" in out and "rollout.max_new_tokens = 256" in out
    for args, fix in ((["show", "llada-espo", "task=chess"], "choose one of math, code, countdown, sudoku"),
                      (["show", "quickstart", "task=math"], "RL recipes (e.g. llada-espo task=countdown)")):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("dare: error: task=") and fix in err[0], err


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_block_cj_grpo_recipes_align_the_budget_to_the_block_grid(family: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # DARE's CJ rollout: align_cj_max_new_tokens (verl/workers/rollout/cj_trajectory.py:108-138)
    assert main(["show", f"{family}-cj-grpo"]) == 0
    assert "rollout.block_aligned_budget = true" in capsys.readouterr().out.lower()
    assert not get_recipe(f"{family}-bgpo").rollout.block_aligned_budget  # type: ignore[attr-defined]
    assert not get_recipe("llada-cj-grpo").rollout.block_aligned_budget  # type: ignore[attr-defined]

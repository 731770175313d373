"""`dare show <recipe>` gives DARE's rollout settings for every SDAR, LLaDA2 and Dream RL recipe.

Each expected value names where DARE (yjyddq/DARE at 83ae8a3) sets it. The commit rules these
settings select are compared with DARE's code in tests/dllm_rollout/test_dare_rules.py
(docs/generation.md#threshold-rule, #dream). Recipes decode natively (`rollout.engine=native`):
`rollout.engine=lmdeploy` runs sdar-bgpo's rule in lmdeploy as DARE's script does.
"""

from __future__ import annotations

import json

import pytest

from dare.recipes import RECIPES, get_recipe, resolve
from dare.show import describe_config

SDAR_BGPO = "recipe/sdar/run_bgpo_sdar_8b_chat.sh"
SDAR_EBPO = "recipe/sdar/run_ebpo_sdar_8b_chat.sh"
SDAR_CJ = "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh"
LLADA2_BGPO = "recipe/llada2_mini/run_bgpo_llada2_mini.sh"
LLADA2_EBPO = "recipe/llada2_mini/run_ebpo_llada2_mini.sh"
LLADA2_CJ = "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh"
LLADA2_GEN = "models/LLaDA2.0-mini/modeling_llada2_moe.py"
SGLANG_LOW = "yjyddq/sglang python/sglang/srt/dllm/algorithm/low_confidence.py (LowConfidence)"
DLLMRL_SDAR = "Gen-Verse/dLLM-RL@10b4fd1 configs/rl_sdar.yaml"
DLLMRL_SDAR_V = "Gen-Verse/dLLM-RL@10b4fd1 configs/rl_sdar_with_value.yaml"
DLLMRL_DREAM = "Gen-Verse/dLLM-RL@10b4fd1 configs/rl_dream.yaml"
DREAM_FAST = "verl/workers/rollout/rollout_utils.py:800-801 (execute_fastdream_generation)"
DREAM_BLOCK = "verl/workers/rollout/generation_utils_block.py:592-593 (the block's first position)"

# recipe -> {rollout field: (value, where DARE sets it)}
BLOCK: dict[str, dict[str, tuple[object, str]]] = {
    "sdar-bgpo": {  # lmdeploy server (the script's default engine, :134)
        "remasking": ("low_confidence_dynamic", f"{SDAR_BGPO}:85 UNMASKING_STRATEGY"),
        "threshold": (0.9, f"{SDAR_BGPO}:87 CONFIDENCE_THRESHOLD"),
        "block_length": (4, f"{SDAR_BGPO}:84 BLOCK_LENGTH"),
        "steps": (4, f"{SDAR_BGPO}:86 DENOISING_STEPS (dynamic: at least one token a step)"),
        "temperature": (1.0, f"{SDAR_BGPO}:230,313"),
        "top_k": (50, f"{SDAR_BGPO}:314"),
        "top_p": (None, f"{SDAR_BGPO}:315 top_p=1.0"),
        "max_new_tokens": (2048, f"{SDAR_BGPO}:178"),
    },
    "sdar-ebpo": {  # SGLang (the script's default engine, :134), no algorithm config
        "remasking": ("low_confidence_dynamic", f"{SDAR_EBPO}:311 dllm_algorithm=LowConfidence"),
        "threshold": (0.95, f"{SGLANG_LOW}: algorithm_config.get('threshold', 0.95)"),
        "block_length": (4, f"{SDAR_EBPO}:240"),
        "steps": (4, f"{SGLANG_LOW}: at most block_size steps, one token at least"),
        "temperature": (1.0, f"{SDAR_EBPO}:232,316"),
        "top_k": (50, f"{SDAR_EBPO}:317"),
        "top_p": (None, f"{SDAR_EBPO}:318 top_p=1.0"),
    },
    "sdar-cj-grpo": {  # SGLang only (:54, :70)
        "remasking": ("low_confidence_dynamic", f"{SDAR_CJ}:134"),
        "threshold": (0.95, "recipe/sdar/sglang_low_confidence_sdar.yaml:2"),
        "block_length": (4, f"{SDAR_CJ}:125; recipe/sdar/sglang_low_confidence_sdar.yaml:1"),
        "steps": (4, f"{SGLANG_LOW}: at most block_size steps"),
        "temperature": (1.0, f"{SDAR_CJ}:124"),
        "top_k": (50, f"{SDAR_CJ}:212"),
        "top_p": (None, f"{SDAR_CJ}:213 top_p=1.0"),
    },
    "sdar-tracerl": {  # TraceRL is not in DARE: its authors' jetengine rollout (sample/jetengine_ext/engine/scheduler.py)
        "remasking": ("low_confidence_dynamic", f"{DLLMRL_SDAR}:44 (scheduler.py:114-118: > threshold, quota at least)"),
        "threshold": (0.9, f"{DLLMRL_SDAR}:45 dynamic_threshold"),
        "block_length": (4, f"{DLLMRL_SDAR}:40"),
        "steps": (4, f"{DLLMRL_SDAR}:41 denoising_steps_per_block"),
        "temperature": (1.0, f"{DLLMRL_SDAR}:38"),
        "top_k": (None, f"{DLLMRL_SDAR}:43 top_k: 0 (off)"),
        "top_p": (1.0, f"{DLLMRL_SDAR}:42"),
        "max_new_tokens": (2000, f"{DLLMRL_SDAR}:39 max_token"),
    },
    "sdar-tracerl-value": {  # the authors' with-value config: the same rollout section, two lines lower
        "remasking": ("low_confidence_dynamic", f"{DLLMRL_SDAR_V}:46"),
        "threshold": (0.9, f"{DLLMRL_SDAR_V}:47 dynamic_threshold"),
        "block_length": (4, f"{DLLMRL_SDAR_V}:42"),
        "steps": (4, f"{DLLMRL_SDAR_V}:43 denoising_steps_per_block"),
        "temperature": (1.0, f"{DLLMRL_SDAR_V}:40"),
        "top_k": (None, f"{DLLMRL_SDAR_V}:45 top_k: 0 (off)"),
        "top_p": (1.0, f"{DLLMRL_SDAR_V}:44"),
        "max_new_tokens": (2000, f"{DLLMRL_SDAR_V}:41 max_token"),
    },
    "llada2-bgpo": {  # LLaDA2's HF generate (the script's default engine, :54; llada2_rollout.py:65-73)
        "remasking": ("low_confidence_dynamic", f"{LLADA2_GEN}:1577-1591"),
        "threshold": (0.95, f"{LLADA2_GEN}:1462 (the rollout passes none: llada2_rollout.py:65-73)"),
        "block_length": (32, f"{LLADA2_BGPO}:130"),
        "steps": (32, f"{LLADA2_BGPO}:97,104 steps=R/2 or R per block ({LLADA2_GEN}:1521,1549-1552): "
                      "one token for each of the first 32 steps"),
        "temperature": (0.6, f"{LLADA2_BGPO}:128"),
        "top_k": (None, f"{LLADA2_GEN}:1459 (llada2_rollout.py:65-73 passes none)"),
        "top_p": (None, f"{LLADA2_GEN}:1458 (llada2_rollout.py:65-73 passes none)"),
        "max_new_tokens": (2048, f"{LLADA2_BGPO}:96"),
    },
    "llada2-ebpo": {
        "remasking": ("low_confidence_dynamic", f"{LLADA2_GEN}:1577-1591"),
        "threshold": (0.95, f"{LLADA2_GEN}:1462"),
        "block_length": (32, f"{LLADA2_EBPO}:132"),
        "steps": (32, f"{LLADA2_EBPO}:99,106 steps=R/2 or R per block"),
        "temperature": (0.6, f"{LLADA2_EBPO}:130"),
        "top_k": (None, f"{LLADA2_GEN}:1459"),
        "top_p": (None, f"{LLADA2_GEN}:1458"),
    },
    "llada2-cj-grpo": {  # SGLang only (:52, :68)
        "remasking": ("low_confidence_dynamic", f"{LLADA2_CJ}:131"),
        "threshold": (0.95, "recipe/llada2_mini/sglang_low_confidence_llada2.yaml:2"),
        "block_length": (32, f"{LLADA2_CJ}:123"),
        "steps": (32, f"{SGLANG_LOW}: at most block_size steps"),
        "temperature": (0.6, f"{LLADA2_CJ}:122"),
        "top_k": (50, f"{LLADA2_CJ}:202"),
        "top_p": (0.95, f"{LLADA2_CJ}:201"),
    },
}

# Dream RL recipes: DARE's Dream rollout, the cached block decoder (use_cache=True in every Dream script
# but MDPO's, e.g. recipe/dream/run_d1_dream_7b_instruct.sh:204), for the algorithms without a Dream
# script too (espo, justgrpo, dmpo; bridgeratio-grpo runs the coupled-grpo script)
DREAM: dict[str, tuple[object, str]] = {
    "remasking": ("entropy", f"{DREAM_FAST} alg='entropy'; cj-grpo: rollout_utils.py:1077-1078"),
    "top_p": (0.95, f"{DREAM_FAST} top_p=0.95 if temperature > 0"),
    "commit_block_start": (True, DREAM_BLOCK),
    "alg_temp": (None, "verl/workers/rollout/rollout_utils.py:802 alg_temp=0.0"),
    "threshold": (None, "verl/workers/rollout/generation_utils_block.py:647 (alg is not 'confidence_threshold')"),
}
DREAM_OWN: dict[str, dict[str, tuple[object, str]]] = {
    "dream-mdpo": {  # MDPO's own full-canvas rollout (use_cache=False, run_mdpo_dream_7b_instruct.sh:178)
        "remasking": ("entropy", "recipe/dream/run_mdpo_dream_7b_instruct.sh:113 conf_alg"),
        "top_p": (None, "verl/workers/rollout/mdpo_dream_rollout.py:220 (config top_p: "
                        "verl/trainer/config/ppo_trainer.yaml:104 top_p: 1)"),
        "commit_block_start": (False, "verl/workers/rollout/mdpo_dream_rollout.py:61-62 (no blocks)"),
    },
    "dream-tracerl": {  # TraceRL is not in DARE: its authors' Dream block rollout (sample/dream_rl_rollout.py)
        "remasking": ("maskgit_plus", f"{DLLMRL_DREAM}:39-42 low_confidence_static, target confidence "
                                      "(the sampled token's probability, dream_rl_rollout.py:74-79)"),
        "top_p": (0.9, f"{DLLMRL_DREAM}:40"),
        "top_k": (50, f"{DLLMRL_DREAM}:41"),
        "commit_block_start": (True, "sample/dream_rl_rollout.py:203 (the block's first position)"),
    },
    "dream-d-treerpo": {  # the tree rollout (verl/workers/dllm_fsdp_workers.py:654-661)
        "remasking": ("low_confidence", "verl/workers/rollout/dtreerpo_llada_rollout.py:80"),
        "top_p": (None, "verl/workers/rollout/dtreerpo_llada_rollout.py (no nucleus filter)"),
        "commit_block_start": (False, "verl/workers/rollout/dtreerpo_llada_rollout.py (no first-position rule)"),
    },
}


def _dream_rl_recipes() -> list[str]:
    return sorted(n for n in RECIPES if n.startswith("dream-") and RECIPES[n]().kind == "rl")


def _expected(name: str) -> dict[str, tuple[object, str]]:
    if name in BLOCK:
        return BLOCK[name]
    return DREAM_OWN.get(name, DREAM)


@pytest.mark.parametrize("name", sorted(BLOCK) + _dream_rl_recipes())
def test_dare_show_gives_dares_rollout_settings(name: str) -> None:
    cfg = get_recipe(name)
    assert cfg.rollout is not None
    shown = describe_config(cfg)
    for field, (value, where) in _expected(name).items():
        assert getattr(cfg.rollout, field) == value, f"{name}: rollout.{field} should be {value!r} ({where})"
        assert f"rollout.{field} = {json.dumps(value)} " in shown  # the line `dare show` prints


def test_every_block_rl_recipe_with_a_dare_script_is_in_the_table() -> None:
    block_rl = {n for n in RECIPES if n.startswith(("sdar-", "llada2-")) and RECIPES[n]().kind == "rl"}
    assert block_rl == set(BLOCK)


@pytest.mark.parametrize("task", ["math", "code", "countdown", "sudoku"])
def test_tasks_keep_the_threshold_rule(task: str) -> None:
    for name in BLOCK:
        cfg = resolve(get_recipe(name), [f"task={task}"])
        assert cfg.rollout is not None
        assert (cfg.rollout.remasking, cfg.rollout.threshold, cfg.rollout.steps) == (
            BLOCK[name]["remasking"][0], BLOCK[name]["threshold"][0], BLOCK[name]["steps"][0])


def test_sdar_bgpo_maps_to_lmdeploys_dynamic_strategy() -> None:
    from dllm_rollout.engines import lmdeploy_engine_config

    rollout = get_recipe("sdar-bgpo").rollout
    assert rollout is not None
    assert lmdeploy_engine_config(rollout) == {  # recipe/sdar/run_bgpo_sdar_8b_chat.sh:84-99
        "dllm_block_length": 4, "dllm_denoising_steps": 4, "dllm_unmasking_strategy": "low_confidence_dynamic",
        "dllm_confidence_threshold": 0.9,
    }

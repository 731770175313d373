"""The built-in RL algorithms: each entry with the recipe defaults it owns and their DARE sources.

Every `_dare(...)` row is a value of a DARE recipe script (yjyddq/DARE at 83ae8a3), with the line's
text transcribed; every `_ours(...)` row is a value that is not DARE's, with the reason. The rows are
applied, in order, on the family's base run (`dare.recipes`); docs/algorithms.md#dare-defaults is
rendered from them (`dare.algorithms.defaults_table`).
"""

from __future__ import annotations

from dare.algorithms import tasks
from dare.algorithms.dream_rollout import DREAM_ROLLOUT, dream_rollout_as
from dare.algorithms.entry import Default, RLEntry
from dare.algorithms.gdpo import GDPO_ENTRY
from dllm_algorithms import (
    BGPO,
    CJGRPO,
    D1,
    DMPO,
    EBPO,
    ESPO,
    MDPO,
    SPG,
    BridgeRatioGRPO,
    CoupledGRPO,
    DTreeRPO,
    JustGRPO,
)


def _dare(key: str, value: object, source: str, quote: str, *families: str, proof: str = "") -> Default:
    return Default(key=key, value=value, dare=source, quote=quote, families=families, proof=proof)


def _ours(key: str, value: object, reason: str, *families: str) -> Default:
    return Default(key=key, value=value, reason=reason, families=families)


_D1_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_d1_llada_8b_instruct.sh:139", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_d1_llada_8b_instruct.sh:140", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_d1_llada_8b_instruct.sh:141", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_d1_llada_8b_instruct.sh:177", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_d1_llada_8b_instruct.sh:143", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_d1_llada_8b_instruct.sh:147", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_d1_llada_8b_instruct.sh:90", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_d1_llada_8b_instruct.sh:91", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_d1_llada_8b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_d1_dream_7b_instruct.sh:139", 'batch_size=16', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_d1_dream_7b_instruct.sh:140", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_d1_dream_7b_instruct.sh:141", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_d1_dream_7b_instruct.sh:178", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_d1_dream_7b_instruct.sh:143", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_d1_dream_7b_instruct.sh:147", 'block_length=32', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_d1_dream_7b_instruct.sh:90", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 512, "recipe/dream/run_d1_dream_7b_instruct.sh:91", 'max_response_length=512', "dream"),
    _dare("rollout.steps", 256, "recipe/dream/run_d1_dream_7b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "dream"),
)
_COUPLED_GRPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:139", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:140", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:141", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:178", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:143", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:148", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:90", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:91", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_coupled_grpo_llada_8b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
    _dare("rl.prompts_per_step", 8, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:139", 'batch_size=8', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:140", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:141", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:179", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:143", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:148", 'block_length=32', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:90", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 512, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:91", 'max_response_length=512', "dream"),
    _dare("rollout.steps", 256, "recipe/dream/run_coupled_grpo_dream_7b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "dream"),
)
_BGPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_bgpo_llada_8b_instruct.sh:139", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_bgpo_llada_8b_instruct.sh:140", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_bgpo_llada_8b_instruct.sh:141", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_bgpo_llada_8b_instruct.sh:179", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_bgpo_llada_8b_instruct.sh:143", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_bgpo_llada_8b_instruct.sh:148", 'block_length=32', "llada"),
    _dare("algorithm.mc_num", 16, "recipe/llada/run_bgpo_llada_8b_instruct.sh:149", 'mc_num=16', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_bgpo_llada_8b_instruct.sh:90", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_bgpo_llada_8b_instruct.sh:91", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_bgpo_llada_8b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_bgpo_dream_7b_instruct.sh:139", 'batch_size=16', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_bgpo_dream_7b_instruct.sh:140", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_bgpo_dream_7b_instruct.sh:141", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_bgpo_dream_7b_instruct.sh:179", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_bgpo_dream_7b_instruct.sh:143", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_bgpo_dream_7b_instruct.sh:148", 'block_length=32', "dream"),
    _dare("algorithm.mc_num", 16, "recipe/dream/run_bgpo_dream_7b_instruct.sh:149", 'mc_num=16', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_bgpo_dream_7b_instruct.sh:90", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 512, "recipe/dream/run_bgpo_dream_7b_instruct.sh:91", 'max_response_length=512', "dream"),
    _dare("rollout.steps", 256, "recipe/dream/run_bgpo_dream_7b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "dream"),
    _dare("rl.group_size", 8, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:227", 'n_rollout=8', "sdar"),
    _dare("rl_optim.lr", 5e-7, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:228", 'lr=5e-7', "sdar"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:271", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "sdar"),
    _dare("rollout.temperature", 1.0, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:230", 'train_temperature=1.0', "sdar"),
    _dare("rollout.block_length", 4, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:238", 'block_length=4', "sdar"),
    _dare("algorithm.mc_num", 16, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:239", 'mc_num=16', "sdar"),
    _dare("data.max_prompt_length", 512, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:177", 'max_prompt_length=512', "sdar"),
    _dare("rollout.max_new_tokens", 2048, "recipe/sdar/run_bgpo_sdar_8b_chat.sh:178", 'max_response_length=2048', "sdar"),
    _dare("rl.prompts_per_step", 16, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:124", 'batch_size=16', "llada2"),
    _dare("rl.group_size", 8, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:125", 'n_rollout=8', "llada2"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:126", 'lr=5e-7', "llada2"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:178", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada2"),
    _dare("rollout.temperature", 0.6, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:128", 'train_temperature=0.6', "llada2"),
    _dare("rollout.block_length", 32, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:130", 'block_length=32', "llada2"),
    _dare("algorithm.mc_num", 16, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:131", 'mc_num=16', "llada2"),
    _dare("data.max_prompt_length", 512, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:95", 'max_prompt_length=512', "llada2"),
    _dare("rollout.max_new_tokens", 2048, "recipe/llada2_mini/run_bgpo_llada2_mini.sh:96", 'max_response_length=2048', "llada2"),
)
_SPG_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_spg_llada_8b_instruct.sh:137", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_spg_llada_8b_instruct.sh:138", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_spg_llada_8b_instruct.sh:139", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_spg_llada_8b_instruct.sh:177", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_spg_llada_8b_instruct.sh:141", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_spg_llada_8b_instruct.sh:145", 'block_length=32', "llada"),
    _dare("algorithm.mc_num", 1, "recipe/llada/run_spg_llada_8b_instruct.sh:146", 'mc_num=1', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_spg_llada_8b_instruct.sh:88", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_spg_llada_8b_instruct.sh:89", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_spg_llada_8b_instruct.sh:90", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_spg_dream_7b_instruct.sh:137", 'batch_size=16', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_spg_dream_7b_instruct.sh:138", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_spg_dream_7b_instruct.sh:139", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_spg_dream_7b_instruct.sh:178", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_spg_dream_7b_instruct.sh:141", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_spg_dream_7b_instruct.sh:145", 'block_length=32', "dream"),
    _dare("algorithm.mc_num", 1, "recipe/dream/run_spg_dream_7b_instruct.sh:146", 'mc_num=1', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_spg_dream_7b_instruct.sh:88", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 512, "recipe/dream/run_spg_dream_7b_instruct.sh:89", 'max_response_length=512', "dream"),
    _dare("rollout.steps", 256, "recipe/dream/run_spg_dream_7b_instruct.sh:90", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "dream"),
)
_ESPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_espo_llada_8b_instruct.sh:248", 'batch_size=16', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_espo_llada_8b_instruct.sh:249", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_espo_llada_8b_instruct.sh:305", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 1.0, "recipe/llada/run_espo_llada_8b_instruct.sh:251", 'train_temperature=1.0', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_espo_llada_8b_instruct.sh:259", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_espo_llada_8b_instruct.sh:187", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_espo_llada_8b_instruct.sh:188", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_espo_llada_8b_instruct.sh:189", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
)
_CJ_GRPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:139", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:140", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:141", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:177", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:143", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:147", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:90", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 256, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:91", 'max_response_length=256', "llada"),
    _dare("rollout.steps", 128, "recipe/llada/run_cj_grpo_llada_8b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 256 / 2 = 128', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:139", 'batch_size=16', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:140", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:141", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:179", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:143", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:147", 'block_length=32', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:90", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 256, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:91", 'max_response_length=256', "dream"),
    _dare("rollout.steps", 128, "recipe/dream/run_cj_grpo_dream_7b_instruct.sh:92", 'num_diffusion_steps=$((max_response_length / 2))  # 256 / 2 = 128', "dream"),
    _dare("rl.prompts_per_step", 16, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:120", 'batch_size=16', "sdar"),
    _dare("rl.group_size", 8, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:121", 'n_rollout=8', "sdar"),
    _dare("rl_optim.lr", 5e-7, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:122", 'lr=5e-7', "sdar"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:172", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "sdar"),
    _dare("rollout.temperature", 1.0, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:124", 'train_temperature=1.0', "sdar"),
    _dare("rollout.block_length", 4, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:125", 'block_length=4', "sdar"),
    _dare("data.max_prompt_length", 512, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:95", 'max_prompt_length=512', "sdar"),
    _dare("rollout.max_new_tokens", 2048, "recipe/sdar/run_cj_grpo_sdar_8b_chat.sh:96", 'max_response_length=2048', "sdar"),
    _dare("rl.prompts_per_step", 16, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:118", 'batch_size=16', "llada2"),
    _dare("rl.group_size", 8, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:119", 'n_rollout=8', "llada2"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:120", 'lr=5e-7', "llada2"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:169", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada2"),
    _dare("rollout.temperature", 0.6, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:122", 'train_temperature=0.6', "llada2"),
    _dare("rollout.block_length", 32, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:123", 'block_length=32', "llada2"),
    _dare("data.max_prompt_length", 512, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:93", 'max_prompt_length=512', "llada2"),
    _dare("rollout.max_new_tokens", 2048, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:94", 'max_response_length=2048', "llada2"),
)
_MDPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_mdpo_llada_8b_instruct.sh:103", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_mdpo_llada_8b_instruct.sh:104", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_mdpo_llada_8b_instruct.sh:105", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_mdpo_llada_8b_instruct.sh:148", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_mdpo_llada_8b_instruct.sh:107", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_mdpo_llada_8b_instruct.sh:117", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_mdpo_llada_8b_instruct.sh:70", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_mdpo_llada_8b_instruct.sh:71", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 256, "recipe/llada/run_mdpo_llada_8b_instruct.sh:72", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_mdpo_dream_7b_instruct.sh:103", 'batch_size=16', "dream"),
    _dare("rl.group_size", 8, "recipe/dream/run_mdpo_dream_7b_instruct.sh:104", 'n_rollout=8', "dream"),
    _dare("rl_optim.lr", 5e-7, "recipe/dream/run_mdpo_dream_7b_instruct.sh:105", 'lr=5e-7', "dream"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/dream/run_mdpo_dream_7b_instruct.sh:148", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "dream"),
    _dare("rollout.temperature", 0.2, "recipe/dream/run_mdpo_dream_7b_instruct.sh:107", 'train_temperature=0.2', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_mdpo_dream_7b_instruct.sh:117", 'block_length=32', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_mdpo_dream_7b_instruct.sh:70", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 512, "recipe/dream/run_mdpo_dream_7b_instruct.sh:71", 'max_response_length=512', "dream"),
    _dare("rollout.steps", 256, "recipe/dream/run_mdpo_dream_7b_instruct.sh:72", 'num_diffusion_steps=$((max_response_length / 2))  # 512 / 2 = 256', "dream"),
)
_D_TREERPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:105", 'batch_size=16', "llada"),
    _dare("rl_optim.lr", 3e-5, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:107", 'lr=3e-5', "llada"),
    _dare("rl_optim.weight_decay", 0.1, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:152", 'actor_rollout_ref.actor.optim.weight_decay=0.1', "llada"),
    _dare("rollout.temperature", 0.9, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:109", 'train_temperature=0.9', "llada"),
    _dare("rollout.block_length", 32, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:123", 'block_length=32', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:68", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 256, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:69", 'max_response_length=256', "llada"),
    _dare("rollout.steps", 128, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:70", 'num_diffusion_steps=128', "llada"),
    _dare("rl.prompts_per_step", 16, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:105", 'batch_size=16', "dream"),
    _dare("rl_optim.lr", 3e-5, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:107", 'lr=3e-5', "dream"),
    _dare("rl_optim.weight_decay", 0.1, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:152", 'actor_rollout_ref.actor.optim.weight_decay=0.1', "dream"),
    _dare("rollout.temperature", 0.9, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:109", 'train_temperature=0.9', "dream"),
    _dare("rollout.block_length", 32, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:123", 'block_length=32', "dream"),
    _dare("data.max_prompt_length", 512, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:68", 'max_prompt_length=512', "dream"),
    _dare("rollout.max_new_tokens", 256, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:69", 'max_response_length=256', "dream"),
    _dare("rollout.steps", 128, "recipe/dream/run_dtreerpo_dream_7b_instruct.sh:70", 'num_diffusion_steps=128', "dream"),
)
_JUSTGRPO_DARE = (
    _dare("rl.prompts_per_step", 16, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:171", 'batch_size=16', "llada"),
    _dare("rl.group_size", 8, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:172", 'n_rollout=8', "llada"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:173", 'lr=5e-7', "llada"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:220", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada"),
    _dare("rollout.temperature", 0.6, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:175", 'train_temperature=0.6', "llada"),
    _dare("rollout.block_length", 1, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:179", 'block_length=1', "llada"),
    _dare("data.max_prompt_length", 512, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:142", 'max_prompt_length=512', "llada"),
    _dare("rollout.max_new_tokens", 512, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:143", 'max_response_length=512', "llada"),
    _dare("rollout.steps", 512, "recipe/llada/run_justgrpo_llada_8b_instruct.sh:144", 'num_diffusion_steps=$max_response_length  # = 512', "llada"),
)
_EBPO_DARE = (
    _dare("rl.group_size", 8, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:229", 'n_rollout=8', "sdar"),
    _dare("rl_optim.lr", 5e-7, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:230", 'lr=5e-7', "sdar"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:273", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "sdar"),
    _dare("rollout.temperature", 1.0, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:232", 'train_temperature=1.0', "sdar"),
    _dare("rollout.block_length", 4, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:240", 'block_length=4', "sdar"),
    _dare("algorithm.mc_num", 16, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:241", 'mc_num=16', "sdar"),
    _dare("data.max_prompt_length", 512, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:179", 'max_prompt_length=512', "sdar"),
    _dare("rollout.max_new_tokens", 2048, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:180", 'max_response_length=2048', "sdar"),
    _dare("rl.prompts_per_step", 16, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:126", 'batch_size=16', "llada2"),
    _dare("rl.group_size", 8, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:127", 'n_rollout=8', "llada2"),
    _dare("rl_optim.lr", 5e-7, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:128", 'lr=5e-7', "llada2"),
    _dare("rl_optim.weight_decay", 0.01, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:180", 'actor_rollout_ref.actor.optim.weight_decay=0.01', "llada2"),
    _dare("rollout.temperature", 0.6, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:130", 'train_temperature=0.6', "llada2"),
    _dare("rollout.block_length", 32, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:132", 'block_length=32', "llada2"),
    _dare("algorithm.mc_num", 16, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:133", 'mc_num=16', "llada2"),
    _dare("data.max_prompt_length", 512, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:97", 'max_prompt_length=512', "llada2"),
    _dare("rollout.max_new_tokens", 2048, "recipe/llada2_mini/run_ebpo_llada2_mini.sh:98", 'max_response_length=2048', "llada2"),
)

# --- rollout rules (docs/algorithms.md#rollout-settings; the rules themselves equal DARE's code in
# tests/dllm_rollout/test_dare_rules.py) ---
_SDAR_BGPO = "recipe/sdar/run_bgpo_sdar_8b_chat.sh"
_LLADA2_GEN = "models/LLaDA2.0-mini/modeling_llada2_moe.py"
_SGLANG_LOW = ("DARE's SGLang fork (yjyddq/sglang, not in DARE's repository) runs LowConfidence: commit every "
               "mask above the threshold, at least one a step; upstream sgl-project's rule, threshold default 0.95")
_RULE_PROOF = "tests/dllm_rollout/test_dare_rules.py::test_block_threshold_rule_equals_dares"
_DYNAMIC = "low_confidence_dynamic"


def _llada2_generate(*, top: bool) -> tuple[Default, ...]:
    """LLaDA2's HF generate (BGPO, EBPO: verl/workers/rollout/llada2_rollout.py:65-73 passes no top-k/top-p)."""
    out = (
        _dare("rollout.remasking", _DYNAMIC, f"{_LLADA2_GEN}:1581", "high_conf_mask = confidence[0] > threshold",
              "llada2", proof=_RULE_PROOF),
        _dare("rollout.threshold", 0.95, f"{_LLADA2_GEN}:1462", "threshold: float = 0.95,", "llada2"),
        _dare("rollout.steps", 32, f"{_LLADA2_GEN}:1521", "steps = min(steps, gen_length // minimal_topk)", "llada2",
              proof="tests/dllm_rollout/test_dare_rules.py::test_llada2_steps_cap_equals_one_token_per_step"),
    )
    if top:
        return out
    return (*out, _dare("rollout.top_k", None, f"{_LLADA2_GEN}:1459", "top_k: Optional[int] = None,", "llada2"),
            _dare("rollout.top_p", None, f"{_LLADA2_GEN}:1458", "top_p: Optional[int] = None,", "llada2"))


def _sglang_low_confidence(family: str, yaml: str) -> tuple[Default, ...]:
    """SGLang's LowConfidence with its config file (CJ-GRPO)."""
    return (_ours("rollout.remasking", _DYNAMIC, _SGLANG_LOW, family),
            _dare("rollout.threshold", 0.95, f"{yaml}:2", "threshold: 0.95", family))


_DREAM_ROLLOUT = DREAM_ROLLOUT
_DREAM_DEFAULT = dream_rollout_as("DARE has no Dream script for this algorithm: DARE's Dream rollout")

_LLADA_ONLY = "DARE has no Dream script for this algorithm: the LLaDA script's value (recipe/llada/{script})"
_DMPO_SOURCE = "DMPO is not in DARE: yuchen-zhu-zyc/DMPO, DMPO/dmpo_train_config.yaml"

BUILTIN: tuple[RLEntry, ...] = (
    RLEntry(name="d1", algorithm=D1(), paper="Zhao et al., arXiv 2504.12216",
            defaults=(*_D1_DARE, *_DREAM_ROLLOUT),
            task_overrides=tasks.grpo_style()),
    RLEntry(name="coupled-grpo", algorithm=CoupledGRPO(), paper="DiffuCoder, arXiv 2506.20639",
            defaults=(*_COUPLED_GRPO_DARE, *_DREAM_ROLLOUT), task_overrides=tasks.grpo_style()),
    # BridgeRatio-GRPO runs the coupled-grpo scripts (DARE PR #21)
    RLEntry(name="bridgeratio-grpo", algorithm=BridgeRatioGRPO(), paper="CURE-RLVR, DARE PR #21 (yjyddq/DARE 6d4791f)",
            defaults=(*_COUPLED_GRPO_DARE, *_DREAM_ROLLOUT), task_overrides=tasks.grpo_style()),
    RLEntry(name="justgrpo", algorithm=JustGRPO(), paper="Ni et al., arXiv 2601.15165", defaults=(
        *_JUSTGRPO_DARE,
        _ours("rollout.block_length", 1, _LLADA_ONLY.format(script="run_justgrpo_llada_8b_instruct.sh:179"), "dream"),
        _ours("rollout.steps", 512, _LLADA_ONLY.format(script="run_justgrpo_llada_8b_instruct.sh:144"), "dream"),
        *_DREAM_DEFAULT,
    ), task_overrides=tasks.grpo_style(one_token_steps=True)),
    RLEntry(name="bgpo", algorithm=BGPO(), paper="Lin et al., arXiv 2510.11683", defaults=(
        *_BGPO_DARE,
        # the script's default engine is lmdeploy (:134), which it starts with these dLLM settings
        _dare("rollout.remasking", _DYNAMIC, f"{_SDAR_BGPO}:85", 'UNMASKING_STRATEGY="low_confidence_dynamic"', "sdar"),
        _dare("rollout.threshold", 0.9, f"{_SDAR_BGPO}:87", "CONFIDENCE_THRESHOLD=0.9", "sdar"),
        _dare("rollout.steps", 4, f"{_SDAR_BGPO}:86", "DENOISING_STEPS=4", "sdar"),
        _dare("rollout.top_k", 50, f"{_SDAR_BGPO}:314", "actor_rollout_ref.rollout.top_k=50", "sdar"),
        *_llada2_generate(top=False),
        *_DREAM_ROLLOUT,
        _ours("rl.prompts_per_step", 16, "DARE sets 16 for its SGLang engine (recipe/sdar/run_bgpo_sdar_8b_chat.sh:225) "
              "and 14 for its default lmdeploy engine (:223, engine default :134), an engine memory limit; 16 keeps "
              "the batch divisible over 8 GPUs and comparable with every earlier measurement", "sdar"),
    ), task_overrides=tasks.grpo_style()),
    RLEntry(name="espo", algorithm=ESPO(), paper="Ou et al., arXiv 2512.03759", defaults=(
        *_ESPO_DARE,
        _dare("rl.group_size", 16, "recipe/llada/run_espo_llada_8b_instruct.sh:193", "n_rollout=16", "llada"),
        _dare("algorithm.mc_num", 2, "recipe/llada/run_espo_llada_8b_instruct.sh:125", "mc_num=${mc_num:-2}", "llada"),
        _ours("rl.group_size", 16, _LLADA_ONLY.format(script="run_espo_llada_8b_instruct.sh:193"), "dream"),
        _ours("rollout.temperature", 1.0, _LLADA_ONLY.format(script="run_espo_llada_8b_instruct.sh:251"), "dream"),
        *_DREAM_DEFAULT,
    ), task_overrides=tasks.espo),
    RLEntry(name="ebpo", algorithm=EBPO(), paper="LLaDA2.1, arXiv 2602.08676", defaults=(
        *_EBPO_DARE,
        _ours("rollout.remasking", _DYNAMIC, _SGLANG_LOW + " (recipe/sdar/run_ebpo_sdar_8b_chat.sh:311)", "sdar"),
        _ours("rollout.threshold", 0.95, _SGLANG_LOW, "sdar"),
        _dare("rollout.top_k", 50, "recipe/sdar/run_ebpo_sdar_8b_chat.sh:317", "actor_rollout_ref.rollout.top_k=50",
              "sdar"),
        *_llada2_generate(top=False),
        _ours("rl.prompts_per_step", 16, "DARE's EBPO script sets 16 for its default SGLang engine "
              "(recipe/sdar/run_ebpo_sdar_8b_chat.sh:227, engine default :134) and 14 for lmdeploy (:225)", "sdar"),
    ), task_overrides=tasks.grpo_style()),
    RLEntry(name="spg", algorithm=SPG(), paper="Wang et al., arXiv 2510.09541",
            defaults=(*_SPG_DARE, *_DREAM_ROLLOUT),
            task_overrides=tasks.grpo_style()),
    RLEntry(name="cj-grpo", algorithm=CJGRPO(), paper="Yang et al., arXiv 2509.23924", defaults=(
        *_CJ_GRPO_DARE,
        *_sglang_low_confidence("sdar", "recipe/sdar/sglang_low_confidence_sdar.yaml"),
        *_sglang_low_confidence("llada2", "recipe/llada2_mini/sglang_low_confidence_llada2.yaml"),
        _ours("rollout.steps", 32, "SGLang's LowConfidence takes at most a block's 32 steps (one token at least a "
              "step)", "llada2"),
        _dare("rollout.top_k", 50, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:202",
              "actor_rollout_ref.rollout.top_k=50", "llada2"),
        _dare("rollout.top_p", 0.95, "recipe/llada2_mini/run_cj_grpo_llada2_mini.sh:201",
              "actor_rollout_ref.rollout.top_p=0.95", "llada2"),
        *_DREAM_ROLLOUT,
        # DARE's CJ rollout ends every response on the block grid, so the terminal block replays completely
        _dare("rollout.block_aligned_budget", True, "verl/workers/rollout/sglang_rollout/sglang_rollout.py:674",
              "aligned_max_new_tokens = align_cj_max_new_tokens(", "sdar", "llada2",
              proof="tests/dllm_rollout/test_budget.py::test_aligned_budgets_equal_dare"),
        _ours("rollout.block_aligned_budget", True, "DARE has no SDAR-MoE RL script; the terminal-block replay "
              "needs whole blocks as on SDAR", "sdar_moe"),
    ), task_overrides=tasks.cj_grpo),
    RLEntry(name="mdpo", algorithm=MDPO(), paper="He et al., arXiv 2508.13148", defaults=(
        *_MDPO_DARE,
        # MDPO's own full-canvas rollout: entropy confidence, no top-p (verl/workers/rollout/mdpo_dream_rollout.py)
        _dare("rollout.remasking", "entropy", "recipe/dream/run_mdpo_dream_7b_instruct.sh:113", 'conf_alg="entropy"',
              "dream"),
    ),
            task_overrides=tasks.grpo_style()),
    RLEntry(name="d-treerpo", algorithm=DTreeRPO(), paper="Pan et al., arXiv 2512.09675", defaults=(
        *_D_TREERPO_DARE,
        _ours("rl.group_size", 16, "DARE runs rollout.n = 1 (recipe/llada/run_dtreerpo_llada_8b_instruct.sh:106) and "
              "grows a tree per prompt; our group is the tree's leaves (branching 4, depth 2)"),
        _dare("rl_optim.betas", (0.9, 0.99), "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:153",
              '+actor_rollout_ref.actor.optim.betas="[0.9,0.99]"'),
        _dare("rl_optim.grad_clip", 0.2, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:167",
              "actor_rollout_ref.actor.grad_clip=0.2"),
        _dare("checkpoint.lora_rank", 128, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:171",
              "actor_rollout_ref.model.lora_rank=128"),
        _dare("checkpoint.lora_alpha", 64.0, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:172",
              "actor_rollout_ref.model.lora_alpha=64"),
        _dare("checkpoint.lora_dropout", 0.05, "recipe/llada/run_dtreerpo_llada_8b_instruct.sh:173",
              "+actor_rollout_ref.model.lora_dropout=0.05"),
        # the tree decodes with LLaDA's low-confidence rule for LLaDA and Dream alike, Gumbel noise at the
        # temperature, no top-k / top-p (verl/workers/rollout/dtreerpo_llada_rollout.py:309-318)
        _dare("rollout.remasking", "low_confidence", "verl/trainer/ppo/dllm_ray_trainer.py:865",
              '"remasking": "low_confidence",'),
        _ours("rollout.top_k", None, "DARE's tree rollout has no top-k filter "
              "(verl/workers/rollout/dtreerpo_llada_rollout.py:309-318: Gumbel argmax over the full logits)"),
        _ours("rollout.top_p", None, "DARE's tree rollout has no nucleus filter "
              "(verl/workers/rollout/dtreerpo_llada_rollout.py:309-318)"),
    )),
    RLEntry(name="dmpo", algorithm=DMPO(), paper="Zhu et al., arXiv 2510.08233", defaults=(
        _ours("rl.group_size", 16, _DMPO_SOURCE),
        _ours("rl_optim.lr", 1e-6, _DMPO_SOURCE),
        _ours("rl_optim.betas", (0.9, 0.99), _DMPO_SOURCE),
        _ours("rl_optim.weight_decay", 0.1, _DMPO_SOURCE),
        _ours("rl_optim.grad_clip", 0.2, _DMPO_SOURCE),
        _ours("rollout.max_new_tokens", 256, _DMPO_SOURCE + " (TRL's default completion length)"),
        _ours("rollout.steps", 128, _DMPO_SOURCE),
        _ours("rollout.temperature", 0.2, _DMPO_SOURCE),
        _ours("checkpoint.lora_rank", 128, _DMPO_SOURCE),
        _ours("checkpoint.lora_alpha", 64.0, _DMPO_SOURCE),
        *_DREAM_DEFAULT,
    )),
    GDPO_ENTRY,
)
"""The built-in RL algorithms, in `dare recipes` order."""

__all__ = ["BUILTIN"]

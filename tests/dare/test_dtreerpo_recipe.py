"""`dare show <family>-d-treerpo` gives DARE's d-TreeRPO recipe (yjyddq/DARE at 83ae8a3,
recipe/llada/run_dtreerpo_llada_8b_instruct.sh, one script for LLaDA and Dream)."""

from __future__ import annotations

import re

import pytest

from dare.cli import main


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_show_gives_dares_dtreerpo_recipe(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", f"{family}-d-treerpo"]) == 0
    lines = {line.split(" = ")[0].strip(): re.split(r"\s{2,}", line.split(" = ", 1)[1].strip())[0]
             for line in capsys.readouterr().out.splitlines() if " = " in line}
    dare = {
        "rl_optim.lr": "3e-05",  # :107
        "rl_optim.weight_decay": "0.1",  # :152
        "rl_optim.betas": "[0.9, 0.99]",  # :153
        "rl_optim.grad_clip": "0.2",  # :167
        "rl.prompts_per_step": "16",  # :105 batch_size = ppo_mini_batch_size (:158)
        "rl.group_size": "16",  # :112-114: 4 trees x 4 branches, 2 levels
        "algorithm.trees": "4",  # :114 num_tree_samples
        "algorithm.branching": "4",  # :112 tree_branch_factor
        "algorithm.depth": "2",  # :113 tree_contraction_factor
        "algorithm.num_iterations": "12",  # :168 ppo_epochs
        "algorithm.mini_batches": "true",  # :158 ppo_mini_batch_size 16 over 8 GPUs (fsdp_workers.py:150-151)
        "algorithm.row_shards": "8",  # :5 eight GPUs
        "algorithm.clip": "0.4",  # :166
        "algorithm.kl_coef": "0.01",  # :162-164 (low_var_kl = k3)
        "rollout.max_new_tokens": "256",  # :69
        "rollout.steps": "128",  # :70
        "rollout.block_length": "32",  # :123
        "rollout.temperature": "0.9",  # :109
        "rollout.remasking": '"low_confidence"',  # dllm_ray_trainer.py:865, for Dream too
        "rollout.top_k": "null",  # dtreerpo_llada_rollout.py:309-318: Gumbel noise, no top-k / top-p
        "rollout.top_p": "null",
        "checkpoint.lora_rank": "128",  # :171
        "checkpoint.lora_alpha": "64.0",  # :172
    }
    assert {k: lines[k] for k in dare} == dare

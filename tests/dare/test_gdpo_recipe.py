"""`dare show <family>-gdpo` gives the authors' GDPO recipe (KevinRojas1499/GDPO at 1918683,
gdpo/slurm_scripts/train.yaml and countdown_base.sbatch), and `dare train llada-gdpo` runs at toy size."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dare.cli import main


def _shown(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    return {line.split(" = ")[0].strip(): re.split(r"\s{2,}", line.split(" = ", 1)[1].strip())[0]
            for line in capsys.readouterr().out.splitlines() if " = " in line}


def test_show_gives_the_authors_gdpo_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "llada-gdpo"]) == 0
    lines = _shown(capsys)
    authors = {
        "algorithm.rule": '"gauss-3"',  # countdown_base.sbatch:21
        "algorithm.mc_samples": "1",  # likelihood_estimators.py:239 mc_batch_size=1
        "algorithm.num_iterations": "12",  # countdown_base.sbatch:23, train.yaml:73
        "algorithm.clip_low": "0.5",  # train.yaml:72 epsilon
        "algorithm.clip_high": "0.5",
        "algorithm.kl_coef": "0.0",  # train.yaml:71 beta
        "rl.group_size": "6",  # train.yaml:37
        "rl.prompts_per_step": "2",  # train.yaml:41-42: 6 completions per device x 2 accumulation steps, 1 process
        "rl_optim.lr": "3e-07",  # train.yaml:34
        "rl_optim.betas": "[0.9, 0.99]",  # train.yaml:23-24
        "rl_optim.weight_decay": "0.1",  # train.yaml:25
        "rl_optim.grad_clip": "0.2",  # train.yaml:26
        "checkpoint.lora_rank": "128",  # train.yaml:10
        "checkpoint.lora_alpha": "64.0",  # train.yaml:11
        "checkpoint.lora_dropout": "0.05",  # train.yaml:12
        "data.max_prompt_length": "200",  # train.yaml:64
        "rollout.max_new_tokens": "256",  # train.yaml:63
        "rollout.block_length": "32",  # train.yaml:65
        "rollout.steps": "128",  # train.yaml:66
        "rollout.remasking": '"low_confidence"',  # train.yaml:68
        "rollout.temperature": "0.9",  # gdpo_config.py:193-194
        "rollout.eos_handling": '"keep"',  # the ELBO covers the whole completion width
    }
    assert {k: lines[k] for k in authors} == authors
    # Dream: the authors run LLaDA only; the algorithm's rows apply, the rollout stays Dream's
    assert main(["show", "dream-gdpo"]) == 0
    dream = _shown(capsys)
    assert dream["algorithm.num_iterations"] == "12" and dream["rollout.temperature"] == "0.2"


def test_gdpo_recipe_trains_a_tiny_llada(tmp_path: Path) -> None:
    import torch

    from dare.tasks.addition import build_tokenizer
    from dllm_models import build_model, save_model
    from tests.conftest import tiny_llada_config
    from tests.dare.helpers import addition_rl_parquet

    tok = build_tokenizer()
    model = build_model(tiny_llada_config(vocab_size=len(tok), embedding_size=len(tok), mask_token_id=tok.mask_token_id,
                                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)  # type: ignore[operator]
    save_model(model, tmp_path / "ckpt", tokenizer=tok)
    pairs = [(12, 34), (5, 71)]
    addition_rl_parquet(tmp_path / "rl.parquet", pairs)
    out = tmp_path / "run"
    assert main(["train", "llada-gdpo", f"checkpoint.checkpoint={tmp_path / 'ckpt'}", "checkpoint.dtype=float32",
                 "checkpoint.lora_rank=2", f"data.train_files={tmp_path / 'rl.parquet'}", "data.max_prompt_length=64",
                 "rollout.max_new_tokens=8", "rollout.steps=4", "rollout.block_length=8", "rl.group_size=2",
                 "algorithm.num_iterations=2", "trainer.max_steps=1", "trainer.optimizer_offload=false",
                 "trainer.activation_checkpointing=false", "--output-dir", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "llada-gdpo" and summary["steps"] >= 1
    assert json.loads((out / "config.json").read_text())["algorithm"]["rule"] == "gauss-3"

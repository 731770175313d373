"""An RL recipe end to end on a tiny released-layout checkpoint and shipped RL data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import load_model, save_model
from tests.dllm_train.helpers import tiny_config


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny-llada"
    save_model(build_tiny_model(tiny_config(), tok), path, tokenizer=tok)
    return path


def test_rl_recipe_trains_from_a_checkpoint_folder_and_exports(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main(["train", "llada-d1", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
                 "data.train_files=countdown", "data.eval_files=sudoku", "data.max_prompt_length=4096",
                 "rollout.max_new_tokens=8", "rollout.steps=8", "rollout.block_length=8",
                 "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=2", "trainer.eval_every=2",
                 "trainer.save_every=1", "--output-dir", str(out), "--no-progress"])
    assert code == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and "eval/sudoku_accuracy" in records[1]
    assert set(load_model(out / "model").state_dict()) == set(load_model(tiny_checkpoint).state_dict())
    summary = json.loads((out / "summary.json").read_text())
    assert "eval/sudoku_score" in summary["results"]["final_eval"]


def test_recipe_without_checkpoint_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        main(["train", "llada-d1", "--output-dir", str(tmp_path / "x")])
    assert err.value.code == 2

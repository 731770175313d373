"""CLI messages speak CLI and suggest the closest name (issue #28 item 4): misspelled recipes,
config keys (top level, nested, algorithm fields, config.json keys), algorithms and families get
"did you mean ...", and the no-weights message names what to copy, not a Python argument."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dare.cli import main
from dare.config import apply_overrides, load_config, save_config
from dare.quickstart import build_tiny_model
from dare.recipes import get_recipe, quickstart
from dare.tasks.addition import build_tokenizer
from dllm_models import save_model
from tests.dare.helpers import tiny_config


@pytest.mark.parametrize(("recipe", "overrides", "needle"), [
    ("llada-d11", [], "recipe 'llada-d11' is unknown (did you mean 'llada-d1'?); choose one of"),
    ("quickstart", ["trainr.max_steps=1"], "unknown config key 'trainr' (did you mean 'trainer'?)"),
    ("quickstart", ["trainer.max_stepz=1"], "unknown config key 'trainer.max_stepz' (did you mean "
                                            "'trainer.max_steps'?)"),
    ("quickstart", ["algorithm.clip_hgh=0.3"], "unknown config key 'algorithm.clip_hgh' (did you mean "
                                               "'algorithm.clip_high'?)"),
    ("quickstart", ["rollout.tempreature=0.5"], "(did you mean 'rollout.temperature'?)"),
    ("quickstart", ["algorithm=bgpoo"], "algorithm 'bgpoo' is unknown (did you mean 'bgpo'?)"),
    ("llada-d1", ["algorithm=grpo"], "algorithm 'grpo' is unknown (did you mean 'gdpo'?); choose one of the RL "
                                     "algorithms ['bgpo', "),  # before: "did you mean 'vrpo'", every kind listed
    ("quickstart", ["rl_optim.lr=-1"], "rl_optim.lr must be > 0, got -1.0"),  # before: "optim.lr must ..."
    ("llada-d1", ["rollout.steps=0"], "rollout.steps must be >= 1, got 0"),  # before: "steps must ..."
    ("llada-d1", ["rollout.block_length=5"], "rollout.block_length (5) must divide rollout.max_new_tokens (512)"),
    ("llada-sft", ["algorithm=sfft"], "(did you mean 'sft'?); choose one of the SFT algorithms ['lora-sft', 'sft']"),
    ("llada-d1", ["checkpoint.family=lada"], "checkpoint.family 'lada' unknown (did you mean 'llada'?)"),
    ("llada-d1", ["checkpoint.dtype=int64"], "checkpoint.dtype='int64' is not a parameter dtype; choose one of "
                                             "['bfloat16', 'float16', 'float32']"),
    ("llada-d1", ["checkpoint.dtype=bfloat"], "(did you mean 'bfloat16'?)"),
])
def test_misspellings_get_the_closest_name(recipe: str, overrides: list[str], needle: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as err:
        apply_overrides(get_recipe(recipe), overrides)
    assert needle in str(err.value)
    with pytest.raises(SystemExit) as exit_:  # the same in one CLI line
        main(["train", recipe, *overrides, "--no-progress"])
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


def test_an_unknown_algorithm_lists_only_the_runs_kind() -> None:
    for recipe in ("quickstart", "llada-d1"):
        with pytest.raises(ValueError) as err:
            apply_overrides(get_recipe(recipe), ["algorithm=grpo"])
        assert "vrpo" not in str(err.value) and "'sft'" not in str(err.value) and "'dpo'" not in str(err.value)


def test_a_config_file_error_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # before: a raw "[Errno 2] No such file or directory: 'missing.json'" and a bare JSON error
    (tmp_path / "torn.json").write_text('{"recipe": ')
    (tmp_path / "bad.json").write_text('{"recipe": "quickstart", "rl_optim": {"lr": -1}}')
    for name, needle in (("missing.json", "cannot read it (No such file or directory)"),
                         ("torn.json", "not JSON (Expecting value at line 1, column 12)"),
                         ("bad.json", "rl_optim.lr must be > 0")):
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--config", str(tmp_path / name), "--no-progress"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and (name == "bad.json" or f"--config {tmp_path / name}: " in err), err


def test_no_close_name_gets_no_suggestion() -> None:
    with pytest.raises(ValueError) as err:
        apply_overrides(quickstart(), ["zzzz.q=1"])
    assert "did you mean" not in str(err.value)


def test_config_json_keys_get_the_closest_name(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    save_config(quickstart(), path)
    data = json.loads(path.read_text())
    data["trainer"]["save_evry"] = data["trainer"].pop("save_every")
    data["rollot"] = data.pop("rollout")
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"unknown config keys \['rollot'\] \(did you mean 'rollout'\?\)"):
        load_config(path)
    data["rollout"] = data.pop("rollot")
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"\['trainer.save_evry'\] \(did you mean 'trainer.save_every'\?\)"):
        load_config(path)


def test_no_weights_speaks_cli_not_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = build_tokenizer()
    folder = tmp_path / "m"
    save_model(build_tiny_model(tiny_config(), tok), folder, tokenizer=tok)
    (folder / "model.safetensors").unlink()
    with pytest.raises(SystemExit):
        main(["train", "llada-d1", f"checkpoint.checkpoint={folder}", "data.train_files=gsm8k",
              "--output-dir", str(tmp_path / "out"), "--no-progress"])
    msg = capsys.readouterr().err
    assert f"checkpoint.checkpoint={str(folder)!r} has no weights" in msg
    assert "load_weights" not in msg and "False" not in msg
    with pytest.raises(SystemExit):
        main(["eval", str(folder), "--limit", "1"])
    msg = capsys.readouterr().err
    assert "has no weights" in msg and "load_weights" not in msg
    shutil.rmtree(folder)

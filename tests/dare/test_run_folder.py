"""A rerun into a run folder resumes the run it holds, or is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dare.cli import main
from dare.config import apply_overrides, to_dict
from dare.recipes import quickstart
from dare.run_folder import (
    check_run_folder,
    config_change_allowed,
    config_changes,
    flatten,
    open_run_folder,
)


def _fake_checkpoint(folder: Path, name: str) -> None:
    """An empty but complete-looking checkpoint (what `list_checkpoints` counts)."""
    (folder / "checkpoints" / name / "model").mkdir(parents=True)
    (folder / "checkpoints" / name / "model" / "config.json").write_text("{}")
    (folder / "checkpoints" / name / "trainer_state.pt").write_bytes(b"")


def test_flatten_and_changes_skip_the_resumable_fields() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {"a.b": 1, "a.c": [1, 2], "d": "x"}
    old = to_dict(quickstart())
    new = to_dict(apply_overrides(quickstart(), [
        "trainer.max_steps=9", "trainer.log_every=3", "trainer.eval_every=0", "trainer.save_every=1",
        "trainer.tensorboard=true", "trainer.wandb=true", "trainer.wandb_project=x", "trainer.num_threads=2",
        "rl_optim.lr=1e-5", "model.d_model=64"]))
    assert config_changes(old, new) == {"model.d_model": (128, 64), "rl_optim.lr": (3e-5, 1e-5)}
    assert config_changes({"a": 1}, {"b": 1}) == {"a": (1, "<absent>"), "b": ("<absent>", 1)}


def test_changed_config_is_refused_with_the_fields_listed(tmp_path: Path) -> None:
    open_run_folder(quickstart(), tmp_path)
    saved = (tmp_path / "config.json").read_text()
    changed = apply_overrides(quickstart(), ["rl_optim.lr=1e-5", "trainer.max_steps=800"])
    with pytest.raises(ValueError, match=r"rl_optim.lr: 3e-05 -> 1e-05\)") as err:
        open_run_folder(changed, tmp_path)
    assert "trainer.max_steps" not in str(err.value).split("Only")[0]  # a resumable field is not listed
    assert "--allow-config-change" in str(err.value)
    assert (tmp_path / "config.json").read_text() == saved  # nothing rewritten
    with config_change_allowed():
        open_run_folder(changed, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rl_optim"]["lr"] == 1e-5
    open_run_folder(apply_overrides(changed, ["trainer.max_steps=5", "trainer.log_every=7"]), tmp_path)


def test_fields_added_since_the_folder_was_written_read_as_defaults(tmp_path: Path) -> None:
    saved = to_dict(quickstart())
    del saved["eval"], saved["trainer"]["seed"]  # an older config.json, without fields added since
    (tmp_path / "config.json").write_text(json.dumps(saved))
    check_run_folder(quickstart(), tmp_path)
    saved["task"]["digits"] = 2
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"task.digits: 2 -> 3"):
        check_run_folder(quickstart(), tmp_path)


def test_max_steps_cannot_drop_below_the_completed_steps(tmp_path: Path) -> None:
    open_run_folder(quickstart(), tmp_path)
    _fake_checkpoint(tmp_path, "0-sft-000300")
    _fake_checkpoint(tmp_path, "1-rl-000400")
    with pytest.raises(ValueError, match="trainer.max_steps=100 is below the 400 steps"):
        check_run_folder(apply_overrides(quickstart(), ["trainer.max_steps=100"]), tmp_path)
    with config_change_allowed(), pytest.raises(ValueError, match="below the 400 steps"):
        check_run_folder(apply_overrides(quickstart(), ["trainer.max_steps=100"]), tmp_path)
    check_run_folder(apply_overrides(quickstart(), ["trainer.max_steps=400"]), tmp_path)
    check_run_folder(apply_overrides(quickstart(), ["trainer.max_steps=600"]), tmp_path)


def test_sft_phase_budget_is_sft_steps(tmp_path: Path) -> None:
    open_run_folder(quickstart(), tmp_path)
    _fake_checkpoint(tmp_path, "0-sft-000300")
    with config_change_allowed(), pytest.raises(ValueError, match="sft.steps=200 is below the 300 steps"):
        check_run_folder(apply_overrides(quickstart(), ["sft.steps=200"]), tmp_path)


def test_output_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        open_run_folder(quickstart(), path)


def test_cli_refuses_before_any_work_and_accepts_the_override(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import dare.quickstart

    open_run_folder(quickstart(), tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    ran: list[bool] = []
    monkeypatch.setattr(dare.quickstart, "run_quickstart", lambda *a, **k: ran.append(True) or {
        "eval_accuracy_before_rl": 0.0, "eval_accuracy_after_rl": 0.0, "num_eval_prompts": 1})
    with pytest.raises(SystemExit) as err:
        main(["train", "model.d_model=64", "--output-dir", str(tmp_path), "--no-progress"])
    assert err.value.code == 2 and not ran
    assert "model.d_model: 128 -> 64" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert main(["train", "model.d_model=64", "--output-dir", str(tmp_path), "--no-progress",
                 "--allow-config-change"]) == 0 and ran

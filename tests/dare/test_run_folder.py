"""A rerun into a run folder resumes the run it holds, or is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dare.cli import main
from dare.config import apply_overrides, to_dict
from dare.quickstart import build_tiny_model
from dare.recipes import quickstart
from dare.tasks.addition import build_tokenizer
from dare.run_folder import (
    check_run_folder,
    config_change_allowed,
    config_changes,
    flatten,
    open_run_folder,
    release_run_folder,
    start_run,
)


def _fake_checkpoint(folder: Path, name: str) -> None:
    """An empty but complete-looking checkpoint (what `list_checkpoints` counts)."""
    (folder / "checkpoints" / name / "model").mkdir(parents=True)
    (folder / "checkpoints" / name / "model" / "config.json").write_text("{}")
    (folder / "checkpoints" / name / "trainer_state.pt").write_bytes(b"")


def _started(folder: Path) -> None:
    """A run that took steps (metrics written): a folder with only a config.json holds no run yet."""
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')


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
    _started(tmp_path)
    saved = (tmp_path / "config.json").read_text()
    changed = apply_overrides(quickstart(), ["rl_optim.lr=1e-5", "trainer.max_steps=800"])
    with pytest.raises(ValueError, match=r"rl_optim.lr: 3e-05 -> 1e-05\)") as err:
        open_run_folder(changed, tmp_path)
    assert "trainer.max_steps" not in str(err.value).split("Only")[0]  # a resumable field is not listed
    assert "--allow-config-change" in str(err.value)
    assert (tmp_path / "config.json").read_text() == saved  # nothing rewritten
    with config_change_allowed():
        open_run_folder(changed, tmp_path)
    # an accepted change is recorded once the folder's checkpoint fits the run (issue #38 T3)
    assert (tmp_path / "config.json").read_text() == saved
    start_run(tmp_path, build_tiny_model(changed, build_tokenizer()), changed.trainer, progress=False)  # type: ignore[arg-type]
    assert json.loads((tmp_path / "config.json").read_text())["rl_optim"]["lr"] == 1e-5
    release_run_folder(tmp_path)
    open_run_folder(apply_overrides(changed, ["trainer.max_steps=5", "trainer.log_every=7"]), tmp_path)


def test_fields_added_since_the_folder_was_written_read_as_defaults(tmp_path: Path) -> None:
    saved = to_dict(quickstart())
    del saved["eval"], saved["trainer"]["seed"]  # an older config.json, without fields added since
    (tmp_path / "config.json").write_text(json.dumps(saved))
    _started(tmp_path)
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
    _started(tmp_path)
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


def test_a_folder_left_by_a_failed_start_is_reused_with_a_new_config(tmp_path: Path) -> None:
    # a first start that failed on its inputs left only config.json (and no lock: the process is gone)
    open_run_folder(quickstart(), tmp_path)
    from dare.run_folder import release_run_folder

    release_run_folder(tmp_path)
    fixed = apply_overrides(quickstart(), ["model.d_model=64"])
    open_run_folder(fixed, tmp_path)  # no --allow-config-change needed: no step was taken
    assert json.loads((tmp_path / "config.json").read_text())["model"]["d_model"] == 64


def test_wandb_without_the_package_is_refused_before_anything_is_written(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="trainer.wandb=true needs the wandb package"):
        open_run_folder(apply_overrides(quickstart(), ["trainer.wandb=true"]), out)
    assert not out.exists()


_HOLD = """
import sys, time
from pathlib import Path
from dare.recipes import quickstart
from dare.run_folder import open_run_folder
open_run_folder(quickstart(), Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_ones_lock_is_taken_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import os
    import subprocess
    import sys

    from dare.run_folder import LOCK, release_run_folder

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid} on "):
            check_run_folder(quickstart(), out)
        with pytest.raises(ValueError, match=rf"pid {holder.pid}"):
            open_run_folder(quickstart(), out)
        with pytest.raises(SystemExit) as exit_:  # `dare train` into the busy folder: refused at once
            main(["train", "--output-dir", str(out), "--no-progress"])
        assert exit_.value.code == 2
    finally:
        holder.kill()
        holder.wait()
    assert (out / LOCK).is_file()  # killed: its lock file stays, but no process holds it
    logging.getLogger().addHandler(caplog.handler)  # main() set up the CLI's own log handler
    with caplog.at_level("WARNING"):
        open_run_folder(quickstart(), out)
    assert any("taking over the lock" in r.getMessage() and str(holder.pid) in r.getMessage() for r in caplog.records)
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    release_run_folder(out)
    assert not (out / LOCK).exists()

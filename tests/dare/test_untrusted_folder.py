"""A run folder is untrusted input (issue #38): a planted link redirects no write, a config change
is recorded only once accepted, another kind of run is refused, a full disk is one error line."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dare.cli import main
from dare.recipes import get_recipe
from dare.run_folder import check_run_folder, config_change_allowed, open_run_folder, release_run_folder
from tests.dare.helpers import TINY


def _train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, *extra, "--output-dir", str(out), "--no-progress"])


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line[:2].isdigit()]  # log lines start with the time
    assert len(lines) == 1 and lines[0].startswith("dare: error: "), err
    return lines[0]


def test_a_config_change_the_checkpoint_does_not_fit_is_one_line_and_rewrites_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # T3: another model shape with --allow-config-change was a 72-line traceback, and config.json was
    # already rewritten, so the folder's own command was refused afterwards
    out = tmp_path / "run"
    assert _train(out, "trainer.max_steps=1", "sft.steps=1") == 0
    saved = (out / "config.json").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        _train(out, "trainer.max_steps=2", "sft.steps=1", "model.d_model=48", "--allow-config-change")
    assert err.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "does not fit the model of this run" in line and "tensor(s) of another shape" in line
    assert (out / "config.json").read_text() == saved  # nothing recorded
    assert _train(out, "trainer.max_steps=2", "sft.steps=1") == 0  # the folder's own command resumes
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_an_accepted_change_is_recorded_once_the_checkpoint_loads(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _train(out, "trainer.max_steps=1", "sft.steps=1") == 0
    assert _train(out, "trainer.max_steps=2", "sft.steps=1", "rl_optim.lr=2e-3", "--allow-config-change") == 0
    assert json.loads((out / "config.json").read_text())["rl_optim"]["lr"] == 2e-3


@pytest.mark.parametrize(("first", "second"), [("quickstart", "llada-d1"), ("llada-d1", "quickstart"),
                                               ("llada-sft", "llada-d1")])
def test_another_kind_of_run_is_refused_even_with_allow_config_change(tmp_path: Path, first: str,
                                                                      second: str) -> None:
    # T4: an RL recipe into a quick start's folder trained 0 steps (its phase 0 was done: SFT) and
    # printed "finished 2 steps"
    open_run_folder(get_recipe(first), tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with config_change_allowed(), pytest.raises(ValueError, match=rf"holds a \w+ run \(recipe '{first}'\).*"
                                                r"cannot continue it; choose a new --output-dir"):
        check_run_folder(get_recipe(second), tmp_path)
    release_run_folder(tmp_path)


def test_a_phase_of_another_name_is_not_resumed(tmp_path: Path) -> None:
    # T4, in the library: phase 0 of the folder was "rl"; an "sft" phase 0 loaded its optimizer state
    from dllm_train import PhaseSpec, Run, save_checkpoint
    from tests.tiny_rl import tiny_model

    model = tiny_model("llada")
    save_checkpoint(tmp_path, order=0, phase="rl", step=2, model=model, state={"owner": {}, "results": {}})

    class Owner:
        def state(self) -> dict[str, Any]:
            return {}

        def load_state(self, state: dict[str, Any]) -> None:
            raise AssertionError("loaded another phase's state")

    run = Run(tmp_path, model, progress=False)
    with pytest.raises(ValueError, match="is of phase 'rl', but this run's phase 0 is 'sft'"):
        run.run_phase(PhaseSpec(order=0, name="sft", steps=4, step_fn=lambda i: {}, owner=Owner()))


@pytest.mark.parametrize("planted", [".lock", "metrics.tmp", ".config.json.tmp", "summary.json",
                                     "checkpoints"])
def test_a_symlink_planted_in_a_run_folder_is_refused_and_nothing_outside_is_written(
        tmp_path: Path, planted: str, capsys: pytest.CaptureFixture[str]) -> None:
    # T6: `dare train` overwrote files outside the folder through planted links, and metrics.jsonl
    # became a link to them
    out, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("precious\n")
    out.mkdir()
    (out / planted).symlink_to(outside if planted == "checkpoints" else victim)
    with pytest.raises(SystemExit) as err:
        _train(out, "trainer.max_steps=1", "sft.steps=1")
    assert err.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"holds symbolic links ({planted} -> " in line and "remove the links" in line
    assert victim.read_text() == "precious\n" and sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert sorted(p.name for p in out.iterdir()) == [planted]  # nothing written in the folder either


def test_library_writes_never_follow_a_link(tmp_path: Path) -> None:
    # the same guarantee without the app's scan: the lock, the metrics' temporary file and the append
    from dare.run_folder import lock_run_folder
    from dllm_train import MetricsWriter, SymlinkRefused

    victim = tmp_path / "victim"
    victim.write_text('{"step": 1}\n')
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.tmp").symlink_to(victim)
    writer = MetricsWriter(out / "metrics.jsonl")  # the temporary link is replaced, not followed
    writer.write({"step": 1, "loss": 0.5})
    assert victim.read_text() == '{"step": 1}\n' and not (out / "metrics.jsonl").is_symlink()
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(SymlinkRefused, match="metrics.jsonl is a symbolic link"):
        writer.write({"step": 2})
    (out / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.lock is a symbolic link"):
        lock_run_folder(out)
    assert victim.read_text() == '{"step": 1}\n'


def test_a_full_disk_during_a_metrics_append_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # T8: ENOSPC in the append was a 26-33 line chained traceback without a `dare: error:` line
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell the metrics file's writes apart")
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(SystemExit) as err:
        _train(tmp_path / "run", "trainer.max_steps=1", "sft.steps=1")
    monkeypatch.undo()
    assert err.value.code == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "could not write" in line and "metrics.jsonl" in line and "No space left on device" in line
    assert "GiB free there: free disk space" in line



def test_a_data_file_replaced_under_the_same_path_is_refused_like_a_changed_setting(tmp_path: Path) -> None:
    # T5: the resume continued silently on other data
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dare.config import apply_overrides
    from dare.run_folder import DATA_STATE, start_run

    data = tmp_path / "sums.parquet"

    def write(answer: str) -> None:
        pq.write_table(pa.table({"data_source": ["gsm8k"], "prompt": [[{"role": "user", "content": "1+1="}]],
                                 "reward_model": [{"ground_truth": answer}]}), data)

    write("2")
    cfg = apply_overrides(get_recipe("llada-d1"), [f"data.train_files={data}"])
    out = tmp_path / "run"
    open_run_folder(cfg, out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    recorded = json.loads((out / DATA_STATE).read_text())["data.train_files"][str(data)]
    check_run_folder(cfg, out)  # the same content resumes
    write("3")  # another answer: other bytes under the same path
    with pytest.raises(ValueError, match=rf"holds a run with a different config \(data.train_files content of {data}: "
                                         rf"'{recorded[:12]}' -> '[0-9a-f]{{12}}'\).*--allow-config-change"):
        check_run_folder(cfg, out)
    with config_change_allowed():  # accepted, and recorded once the run starts
        open_run_folder(cfg, out)
    assert json.loads((out / DATA_STATE).read_text())["data.train_files"][str(data)] == recorded
    from tests.tiny_rl import tiny_model

    start_run(out, tiny_model("llada"), cfg.trainer, progress=False)
    assert json.loads((out / DATA_STATE).read_text())["data.train_files"][str(data)] != recorded
    check_run_folder(cfg, out)
    release_run_folder(out)

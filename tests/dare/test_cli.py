"""The dare command end to end on a tiny configuration, including resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_models import load_model, load_tokenizer
from tests.dare.helpers import TINY, measured

ROOT = Path(__file__).resolve().parents[2]


def _dare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "apps" / "dare"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def test_recipes_lists_quickstart_and_d1() -> None:
    out = _dare("recipes")
    assert out.returncode == 0, out.stderr
    assert "quickstart" in out.stdout and "d1" in out.stdout
    recipes = out.stdout.split("\n\nalgorithms:\n")[0].splitlines()
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in recipes}
    assert len(starts) == 1, starts  # before: names longer than 20 characters pushed their description right


def test_train_writes_all_outputs_and_resumes(tmp_path: Path) -> None:
    out_dir = tmp_path / "run"
    first = _dare("train", *TINY, "trainer.max_steps=2", "--output-dir", str(out_dir), "--no-progress")
    assert first.returncode == 0, first.stderr
    for name in ("metrics.jsonl", "sft_metrics.jsonl", "summary.json", "config.json", "reward.png"):
        assert (out_dir / name).is_file(), name
    summary = json.loads((out_dir / "summary.json").read_text())
    assert 0.0 <= summary["eval_accuracy_before_rl"] <= 1.0
    assert 0.0 <= summary["eval_accuracy_after_rl"] <= 1.0
    model = load_model(out_dir / "model")
    assert model.traits.mask_token_id == load_tokenizer(out_dir / "model").mask_token_id  # type: ignore[union-attr]
    # rerun with more steps: resumes after step 2 and matches an uninterrupted 4-step run
    again = _dare("train", *TINY, "trainer.max_steps=4", "--output-dir", str(out_dir), "--no-progress")
    assert again.returncode == 0, again.stderr
    straight_dir = tmp_path / "straight"
    straight = _dare("train", *TINY, "trainer.max_steps=4", "--output-dir", str(straight_dir), "--no-progress")
    assert straight.returncode == 0, straight.stderr
    resumed = measured(out_dir / "metrics.jsonl")  # (without wall-clock timings)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed == measured(straight_dir / "metrics.jsonl")


def test_bad_override_exits_2_with_message(tmp_path: Path) -> None:
    out = _dare("train", "rl.group_size=1", "--output-dir", str(tmp_path / "x"))
    assert out.returncode == 2 and "rl.group_size must be >= 2" in out.stderr


def test_held_out_evaluation_decodes_block_models_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import importlib

    from dare.quickstart import evaluate_accuracy
    from dare.recipes import quickstart
    from tests.dare.helpers import TASK
    from tests.tiny_rl import tiny_model

    gen = importlib.import_module("dllm_rollout.generate")
    seen: list[bool] = []
    real = gen.decode_blocks

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(True)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gen, "decode_blocks", spy)
    cfg = quickstart()
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, batch_size=4))
    acc = evaluate_accuracy(tiny_model("sdar"), TASK, cfg)  # the helpers' task: 20 held-out pairs
    assert 0.0 <= acc <= 1.0 and seen


def test_a_full_disk_ends_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # before: the checkpoint's OSError carried no file name, so the CLI re-raised a 66-line chained traceback
    import errno

    import dllm_train.run
    from dare.cli import main

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dllm_train.run, "write_checkpoint_files", full)
    with pytest.raises(SystemExit) as err:
        main(["train", *TINY, "sft.steps=1", "task.num_eval=2", "--output-dir", str(tmp_path / "run"), "--no-progress"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("dare: error: could not write the checkpoint") and "No space left" in lines[-1]
    assert not any("Traceback" in line for line in lines)


@pytest.mark.slow
def test_sigterm_checkpoints_prints_the_resume_command_and_exits_143(tmp_path: Path) -> None:
    import signal
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "apps" / "dare"), "train", *TINY, "sft.steps=400", "--output-dir", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((out / "sft_metrics.jsonl").is_file() and (out / "sft_metrics.jsonl").read_text().count("\n") >= 2):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "resumes from its checkpoint 0-sft-" in err and "--output-dir" in err
    from dllm_train import latest_checkpoint

    ref = latest_checkpoint(out)
    assert ref is not None and ref.phase == "sft" and 2 <= ref.step < 400


@pytest.mark.slow
@pytest.mark.parametrize("signum", [2, 15])  # SIGINT (a terminal's Ctrl-C), SIGTERM (Slurm's scancel)
def test_a_signal_to_the_process_group_of_uv_run_keeps_the_checkpoint(signum: int, tmp_path: Path) -> None:
    # before: `uv run` forwarded the signal its process group had already received, and Python took
    # the copy for a second signal: "stop now", no checkpoint of the finished step
    import os
    import shutil
    import time

    from dllm_train import latest_checkpoint

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    out = tmp_path / "run"
    metrics = out / "sft_metrics.jsonl"
    cmd = [uv, "run", "--no-sync", "apps/dare", "train", *TINY, "sft.steps=400", "--output-dir", str(out),
           "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    os.killpg(proc.pid, signum)  # as a terminal and a scheduler send it: to every process of the group
    done = metrics.read_text().count("\n")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err
    ref = latest_checkpoint(out)
    assert ref is not None and ref.phase == "sft" and done <= ref.step < 400, err
    assert f"resumes from its checkpoint {ref.path.name}: uv run apps/dare train" in err


_CHEAP = """
import contextlib, io, sys
from dare.cli import main
for words in (["recipes"], ["train", "quickstrat"], ["runs", "no-such-folder"], ["show", "quickstart"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(words)
        except SystemExit:
            pass
    print(" ".join(words), [m for m in ("torch.distributed.tensor", "torch.distributed.fsdp", "ray") if m in sys.modules])
"""


def test_cheap_commands_do_not_import_the_distributed_stack() -> None:
    # before: `dare recipes` or a misspelled recipe imported torch.distributed.tensor (via
    # dllm_train.offload, 3.2 s of the CLI's 9-12 s on an idle 2-core machine)
    out = subprocess.run([sys.executable, "-c", _CHEAP], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["recipes []", "train quickstrat []", "runs no-such-folder []",
                                       "show quickstart []"]


def test_overrides_are_accepted_after_an_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # before: `dare train quickstart --output-dir runs/x sft.steps=1` was refused as "unrecognized arguments"
    import dare.quickstart
    from dare.cli import main

    seen: list[object] = []

    def fake(cfg: object, out: Path, progress: bool) -> dict[str, float]:
        seen.append(cfg)
        return {"eval_accuracy_before_rl": 0.0, "eval_accuracy_after_rl": 0.0, "num_eval_prompts": 0}

    monkeypatch.setattr(dare.quickstart, "run_quickstart", fake)
    words = ["train", "quickstart", "rl.group_size=4", "--output-dir", str(tmp_path / "x"), "sft.steps=1",
             "--no-progress", "trainer.max_steps=2"]
    assert main(words) == 0
    cfg = seen[0]
    assert (cfg.rl.group_size, cfg.sft.steps, cfg.trainer.max_steps) == (4, 1, 2)  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as err:
        main(["train", "quickstart", "--output-dir", str(tmp_path / "y"), "--bogus"])
    assert err.value.code == 2
    assert "unrecognized arguments: --bogus (options: `dare train --help`; overrides are dotted key=value" \
        in capsys.readouterr().err


def test_an_interrupted_command_ignores_further_signals_on_its_way_out(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # the copy of a Ctrl-C that `uv run` forwards ~0.2 s later must not end in a traceback instead of the resume line
    import signal

    import dare.quickstart
    from dare.cli import main

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dare.quickstart, "run_quickstart", interrupted)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as err:
            main(["train", "--output-dir", str(tmp_path / "q"), "--no-progress"])
        assert err.value.code == 130
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])

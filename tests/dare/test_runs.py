"""`dare runs` and `dare compare` on run folders built by hand (config.json, metrics, summary,
checkpoints, the writer's lock), so every status is pinned without training."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dare.cli import main
from dare.compare import config_differences, curve
from dare.config import to_dict
from dare.runs import format_runs, list_runs, read_run
from tests.dare.helpers import tiny_config


def _run(folder: Path, *, steps: int = 0, total: int = 4, summary: bool = False, lr: float = 1e-3,
         extra: dict[str, Any] | None = None, checkpoints: tuple[int, ...] = ()) -> Path:
    folder.mkdir(parents=True)
    cfg = to_dict(tiny_config(f"trainer.max_steps={total}", f"rl_optim.lr={lr}"))
    (folder / "config.json").write_text(json.dumps(cfg))
    records = [{"step": s, "reward_mean": 0.1 * s, "loss": 1.0 / s, "response_length": 4.0 + s,
                **(extra or {}).get(s, {})} for s in range(1, steps + 1)]
    if records:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for s in checkpoints:
        (folder / "checkpoints" / f"1-rl-{s:06d}").mkdir(parents=True)
    if summary:
        (folder / "summary.json").write_text(json.dumps({"eval_accuracy_after_rl": 0.75}))
    return folder


def test_each_status_is_read_from_the_folder(tmp_path: Path) -> None:
    finished = _run(tmp_path / "a-finished", steps=4, summary=True)
    interrupted = _run(tmp_path / "b-interrupted", steps=2, checkpoints=(2,))
    failed = _run(tmp_path / "c-failed")
    raised = _run(tmp_path / "d-raised", steps=4, total=8, summary=True)  # budget raised after it finished
    running = _run(tmp_path / "e-running", steps=1)
    stale = _run(tmp_path / "f-stale", steps=3)
    (stale / ".lock").write_text(json.dumps({"pid": 2**22 + 12345, "host": "x", "started": "then"}))
    (tmp_path / "not-a-run").mkdir()
    fd = os.open(running / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the writer holds it for its life
    try:
        status = {r.path.name: r.status for r in list_runs(tmp_path)}
    finally:
        os.close(fd)
    assert status == {"a-finished": "finished", "b-interrupted": "interrupted", "c-failed": "failed",
                      "d-raised": "interrupted", "e-running": "running", "f-stale": "interrupted"}
    assert read_run(running) is not None and read_run(running).status == "interrupted"  # lock released
    info = read_run(finished)
    assert info is not None and (info.steps_done, info.steps_total) == (4, 4) and info.recipe == "quickstart"
    assert info.reward == pytest.approx(0.4) and info.accuracy == 0.75  # summary's after-RL accuracy
    assert read_run(failed).steps_done == 0  # type: ignore[union-attr]
    assert read_run(raised).steps_total == 8  # type: ignore[union-attr]
    assert read_run(interrupted).accuracy is None  # type: ignore[union-attr]


def test_sft_checkpoints_are_not_counted_as_rl_steps(tmp_path: Path) -> None:
    # before: the quick start's SFT checkpoint 0-sft-000200 made `dare runs` print 200/4
    run = _run(tmp_path / "q", steps=2, checkpoints=(2,))
    (run / "checkpoints" / "0-sft-000200").mkdir()
    info = read_run(run)
    assert info is not None and (info.steps_done, info.steps_total) == (2, 4)


def test_a_checkpoint_recipes_final_eval_is_its_accuracy(tmp_path: Path) -> None:
    run = _run(tmp_path / "rl", steps=4, extra={4: {"eval/gsm8k_accuracy": 0.1}})
    (run / "summary.json").write_text(json.dumps({"steps": 4, "results": {"final_eval": {
        "eval/gsm8k_accuracy": 0.6, "eval/gsm8k_score": 0.9, "eval/math500_accuracy": 0.2}}}))
    info = read_run(run)
    assert info is not None and info.accuracy == pytest.approx(0.4) and info.status == "finished"


def test_accuracy_steps_and_a_torn_line(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", steps=3, extra={2: {"eval/gsm8k_accuracy": 0.2, "eval/math500_accuracy": 0.4},
                                                3: {"eval_accuracy": float("nan")}}, checkpoints=(5,))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward_m')  # a write cut by a kill
    info = read_run(run)
    assert info is not None and info.accuracy == pytest.approx(0.3) and info.steps_done == 5
    assert info.reward == pytest.approx(0.3)
    table = format_runs([info]).splitlines()
    assert table[0].split() == ["run", "recipe", "algorithm", "steps", "reward", "held-out", "acc", "status"]
    assert table[1].split() == ["r", "quickstart", "d1", "5/4", "0.3", "30.0%", "interrupted"]


def test_dare_runs_lists_and_compare_shows_differences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "runs" / "one", steps=4, summary=True)
    _run(tmp_path / "runs" / "two", steps=2, lr=3e-3, extra={2: {"eval_accuracy": 0.5}})
    assert main(["runs", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in lines] == ["run", "one", "two"] and lines[2].split()[-1] == "interrupted"
    out = tmp_path / "cmp.png"
    assert main(["compare", str(tmp_path / "runs" / "one"), str(tmp_path / "runs" / "two"),
                 "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rl_optim.lr  0.001  0.003" in text and "trainer.max_steps" not in text
    assert "held-out accuracy       75.0%       50.0%" in text
    assert out.stat().st_size > 10_000  # a drawn figure


def test_config_differences_and_curves() -> None:
    diffs = config_differences([{"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 1, "c": 3}}])
    assert diffs == {"a.c": [2, 3], "d": [1, "<absent>"]}
    records = [{"step": 1, "eval/x_accuracy": 0.5}, {"step": 2, "loss": 1.0}, {"step": 3, "loss": float("nan")}]
    assert curve(records, "accuracy") == [(1, 0.5)] and curve(records, "loss") == [(2, 1.0)]


@pytest.mark.parametrize("words, message", [
    (["compare", "{tmp}/one"], "dare compare needs two run folders or more, got 1"),
    (["compare", "{tmp}/one", "{tmp}/nothing"], "nothing is not a run folder"),
    (["compare", "{tmp}/one", "{tmp}/one", "--output", "{tmp}/x.pdf"], "pass a path ending in .png"),
    (["runs", "{tmp}/missing"], "missing is not a folder"),
])
def test_bad_arguments_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str],
                                    message: str) -> None:
    _run(tmp_path / "one", steps=1)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main([w.format(tmp=tmp_path) for w in words])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("dare: error: ") and message in err
    assert len(err.strip().splitlines()) == 1

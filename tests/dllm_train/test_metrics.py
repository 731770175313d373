"""metrics.jsonl truncation on resume and the optional W&B sink (through a fake `wandb` module)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dllm_train import MetricsWriter, TrainerConfig, open_wandb, read_metrics


class FakeRun:
    """Records what a `wandb.Run` is asked to do."""

    def __init__(self, **init: Any) -> None:
        self.init = init
        self.logged: list[dict[str, Any]] = []
        self.metrics: list[tuple[str, str | None]] = []
        self.finished = False

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.metrics.append((name, step_metric))

    def log(self, data: dict[str, Any]) -> None:
        self.logged.append(data)

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    runs: list[FakeRun] = []

    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return runs


def test_writer_truncates_records_past_the_resume_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3)))
    writer = MetricsWriter(path, resume_step=2)
    writer.write({"step": 3, "loss": float("nan")})
    writer.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert read_metrics(path)[-1]["loss"] == "nan"


def test_wandb_is_offline_without_a_key_and_resumes_the_same_run(tmp_path: Path, fake_wandb: list[FakeRun]) -> None:
    first = open_wandb(tmp_path / "run", project="p", config={"lr": 1e-3})
    again = open_wandb(tmp_path / "run", project="p", name="named")
    assert first.init["mode"] == "offline" and first.init["dir"] == str(tmp_path / "run")
    assert first.init["name"] == "run" and again.init["name"] == "named"
    assert first.init["id"] == again.init["id"]
    assert first.init["config"] == {"lr": 1e-3}


@pytest.mark.parametrize("env", [{"WANDB_API_KEY": "x"}, {"WANDB_MODE": "disabled"}])
def test_wandb_mode_is_left_to_wandb_with_a_key_or_an_explicit_mode(
        env: dict[str, str], tmp_path: Path, fake_wandb: list[FakeRun], monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run = open_wandb(tmp_path, project="p")
    assert run.init["mode"] is None and run.init["resume"] == "allow"


def test_writer_logs_each_phase_on_its_own_step_axis(tmp_path: Path, fake_wandb: list[FakeRun]) -> None:
    run = open_wandb(tmp_path, project="p")
    writer = MetricsWriter(tmp_path / "m.jsonl", wandb_run=run, phase="sft")
    writer.write({"step": 1, "loss": 2.5, "note": "text"})
    assert run.metrics == [("sft/step", None), ("sft/*", "sft/step")]
    assert run.logged == [{"sft/step": 1, "sft/loss": 2.5}]


def test_missing_wandb_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'dllm-train\[wandb\]'.*uv sync --extra wandb"):
        open_wandb(tmp_path, project="p")


def test_wandb_needs_a_project() -> None:
    with pytest.raises(ValueError, match="trainer.wandb_project"):
        TrainerConfig(wandb=True, wandb_project=" ")


def test_curves_skip_empty_panels_keep_flat_ones_and_mark_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure

    from dllm_train.metrics import plot_curves, plotted_keys

    nan = float("nan")
    records = [{"step": i, "reward_mean": 0.1 * i, "ppo_kl": 0.0, "consistency": nan, "eval_accuracy": nan}
               for i in range(1, 5)]
    records[-1]["eval_accuracy"] = 0.8
    points = {"eval_accuracy": [(0, 0.41, "after SFT")], "loss": [(0, nan, "nothing")]}
    keys = ["reward_mean", "eval_accuracy", "ppo_kl", "consistency", "loss", "absent"]
    # all-NaN curves and keys with only a NaN point get no panel; a flat curve (ppo_kl at 0) keeps its own
    assert plotted_keys(records, keys, points) == ["reward_mean", "eval_accuracy", "ppo_kl"]
    assert plotted_keys([{"step": 1}], ["x"], {"x": [(0, 0.5, "before")]}) == ["x"]  # a point alone: a panel
    titles: list[str] = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle",
                        lambda self, t, **kw: titles.append(t))  # type: ignore[misc]
    path = plot_curves(records, keys, tmp_path / "reward.png", title="d1: 41% -> 80%", points=points)
    assert path is not None and path.stat().st_size > 0 and titles == ["d1: 41% -> 80%"]
    assert plot_curves(records, ["consistency", "absent"], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_flat_curve_keeps_its_panel_labelled_as_flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    from dllm_train.metrics import flat_value, plot_curves

    records = [{"step": i, "reward_mean": 0.0, "loss": 0.5 / i} for i in range(1, 5)]
    assert flat_value(records, "reward_mean") == 0.0 and flat_value(records, "loss") is None
    titles: list[str] = []
    labels: list[str] = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, **kw: titles.append(t))  # type: ignore[misc]
    real = matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                        lambda self, t, **kw: (labels.append(t), real(self, t, **kw))[1])  # type: ignore[misc]
    assert plot_curves(records, ["reward_mean", "loss"], tmp_path / "curves.png") is not None
    assert titles == ["reward_mean is flat at 0 over all 4 steps"]
    assert labels == ["reward_mean\n(flat at 0)", "loss"]


def test_a_torn_last_line_is_cut_and_reported_when_the_run_resumes(tmp_path: Path, caplog: Any) -> None:
    from dllm_train import MetricsWriter, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')  # killed mid-write
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3, is not a JSON record"):
        read_metrics(path)
    with caplog.at_level("WARNING"):
        MetricsWriter(path, resume_step=2).close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert any(str(path) in r.getMessage() and "torn" in r.getMessage() for r in caplog.records)

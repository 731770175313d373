"""A run's figure: the reward and every held-out accuracy first, a title naming recipe, algorithm and
run folder with the last reward and accuracy; an all-zero reward keeps its panel (labelled flat)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.axes
import matplotlib.figure
import pytest

from dare.sinks import curve_keys, curves_title, drop_zero_panels
from dllm_train import plot_curves
from tests.dare.helpers import tiny_config

RL_CURVES = ("reward_mean", "response_length", "loss", "clip_frac")  # what the RL pipeline asks for


def _records() -> list[dict[str, float]]:
    records = [{"step": float(s), "reward_mean": 0.0, "response_length": 8.0, "loss": 0.1 * s, "clip_frac": 0.0}
               for s in range(1, 5)]
    records[1]["eval/gsm8k_accuracy"] = 0.25
    records[3]["eval/gsm8k_accuracy"] = 0.5
    records[3]["eval/math500_accuracy"] = 0.1
    return records


def test_reward_and_held_out_accuracy_come_first() -> None:
    assert curve_keys(_records(), RL_CURVES) == ["reward_mean", "eval/gsm8k_accuracy", "eval/math500_accuracy",
                                                 "response_length", "loss", "clip_frac"]
    assert curve_keys([{"step": 1, "loss": 1.0}], ("loss", "grad_norm")) == ["loss", "grad_norm"]  # SFT: as asked


def test_title_names_recipe_folder_and_last_values(tmp_path: Path) -> None:
    cfg = tiny_config()
    title = curves_title(cfg, tmp_path / "run", _records())
    assert title == (f"quickstart (d1) in {tmp_path / 'run'}\n"
                     "4 steps, last reward 0, held-out accuracy 30.0%")
    assert curves_title(cfg, tmp_path, [], "d1 RL: 41% -> 85%").endswith("\nd1 RL: 41% -> 85%")


def test_an_all_zero_reward_keeps_its_panel_in_curves_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    titles: list[str] = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t))  # type: ignore[misc]
    labels: list[str] = []
    real = matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                        lambda self, t, **kw: (labels.append(t), real(self, t, **kw))[1])  # type: ignore[misc]
    records = _records()
    path = plot_curves(records, curve_keys(records, RL_CURVES), tmp_path / "curves.png",
                       title=curves_title(tiny_config(), tmp_path, records))
    assert path is not None and path.stat().st_size > 0
    assert labels == ["reward_mean\n(flat at 0)", "eval/gsm8k_accuracy", "eval/math500_accuracy",
                      "response_length\n(flat at 8)", "loss", "clip_frac\n(flat at 0)"]
    assert titles and titles[0].startswith("quickstart (d1) in ")


def test_panels_at_zero_by_construction_are_dropped_and_named() -> None:
    # before: the quick start's reward.png spent 3 of 6 panels on clip_frac, ppo_kl and the consistency gap at 0
    records = [{**r, "ppo_kl": 0.0, "consistency_max_abs_gap": 0.0, "eval_accuracy": 0.0, "loss": 0.0}
               for r in _records()]
    keys = ["reward_mean", "eval_accuracy", "loss", "clip_frac", "ppo_kl", "consistency_max_abs_gap", "absent"]
    drawn, dropped = drop_zero_panels(records, keys)
    assert drawn == ["reward_mean", "eval_accuracy", "loss", "absent"]  # reward, accuracy and loss stay at 0
    assert dropped == ["clip_frac", "ppo_kl", "consistency_max_abs_gap"]
    records[0]["consistency_max_abs_gap"] = 2e-7  # float32 rounding: dropped only within its tolerance
    assert "consistency_max_abs_gap" in drop_zero_panels(records, keys)[0]
    assert drop_zero_panels(records, keys, tolerance={"consistency_max_abs_gap": 1e-4})[1] == dropped


def test_the_quickstart_figure_draws_no_zero_panel_and_whole_steps(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import dare.quickstart
    from dare.cli import main

    seen: list[tuple[list[str], str]] = []
    ticks: list[list[float]] = []
    real_plot, real_save = dare.quickstart.plot_curves, matplotlib.figure.Figure.savefig
    monkeypatch.setattr(dare.quickstart, "plot_curves",
                        lambda records, keys, path, **kw: (seen.append((list(keys), kw["title"])),
                                                           real_plot(records, keys, path, **kw))[1])
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **kw: (ticks.extend(list(ax.get_xticks()) for ax in self.axes),
                                                real_save(self, *a, **kw))[1])
    from tests.dare.helpers import TINY

    assert main(["train", *TINY, "sft.steps=1", "trainer.max_steps=2", "--output-dir", str(tmp_path / "q"),
                 "--no-progress"]) == 0
    (keys, title), = seen
    assert "clip_frac" not in keys and "ppo_kl" not in keys and "not drawn: clip_frac, ppo_kl" in title
    assert ticks and all(float(t).is_integer() for axis in ticks for t in axis)  # before: 1.25, 1.5, ... on 2 steps

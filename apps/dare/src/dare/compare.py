"""`dare compare RUN RUN ... [--output FILE.png]`: the config fields in which run folders differ,
their final metrics, and their curves overlaid (reward, held-out accuracy, loss, response length
against step)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from dare.run_folder import flatten
from dare.runs import RunInfo, accuracy_of, last_value, read_jsonl, read_run

PANELS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward (mean)"),
    ("accuracy", "held-out accuracy"),
    ("loss", "loss"),
    ("response_length", "response length (tokens)"),
)
"""The compared curves, top to bottom: metric key (`accuracy`: `runs.accuracy_of`) and label."""

_ABSENT = "<absent>"


def config_differences(configs: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Dotted key -> its value in each config, for the keys whose values are not all equal (a key
    one config lacks reads as `<absent>`)."""
    flat = [flatten(c) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    out = {}
    for key in keys:
        values = [f.get(key, _ABSENT) for f in flat]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def curve(records: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of `key` in `records` (`accuracy`: the held-out accuracy of each record)."""
    out = []
    for r in records:
        value = accuracy_of(r) if key == "accuracy" else r.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and "step" in r:
            out.append((int(r["step"]), float(value)))
    return out


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _fmt(value: float | None, percent: bool = False) -> str:
    return "-" if value is None else (f"{100 * value:.1f}%" if percent else f"{value:.4g}")


def compare_text(runs: Sequence[RunInfo], configs: Sequence[dict[str, Any]],
                 records: Sequence[Sequence[dict[str, Any]]]) -> str:
    """The config differences and the final metrics of `runs`, as two aligned tables."""
    names = [r.path.name for r in runs]
    if len(set(names)) < len(names):
        names = [str(r.path) for r in runs]
    diffs = config_differences(configs)
    lines = ["config differences:" if diffs else "config differences: none (the configs are equal)"]
    if diffs:
        lines.append(_table([["field", *names], *([k, *(_cell(v) for v in vs)] for k, vs in diffs.items())]))
    final = [["", *names],
             ["recipe", *(r.recipe for r in runs)],
             ["status", *(r.status for r in runs)],
             ["steps", *(f"{r.steps_done}/{r.steps_total}" for r in runs)],
             ["reward (last)", *(_fmt(r.reward) for r in runs)],
             ["held-out accuracy", *(_fmt(r.accuracy, percent=True) for r in runs)],
             ["loss (last)", *(_fmt(last_value(list(rec), "loss")) for rec in records)],
             ["response length (last)", *(_fmt(last_value(list(rec), "response_length")) for rec in records)]]
    lines += ["", "final metrics:", _table(final)]
    return "\n".join(lines)


def plot_compare(runs: Sequence[RunInfo], records: Sequence[Sequence[dict[str, Any]]], path: Path) -> Path:
    """One PNG: a panel per curve of `PANELS`, one line per run; a panel no run logged says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.3 * len(PANELS) + 0.5), squeeze=False, sharex=True)
    for ax, (key, label) in zip(axes[:, 0], PANELS):
        drawn = 0
        for run, rec in zip(runs, records):
            points = curve(rec, key)
            if points:
                flat = " (flat)" if len({v for _, v in points}) == 1 else ""
                ax.plot([p[0] for p in points], [p[1] for p in points], lw=1.0,
                        marker="." if len(points) < 30 else None, label=f"{run.path.name}{flat}")
                drawn += 1
        ax.set_ylabel(label, fontsize=8)
        if drawn:
            ax.legend(loc="best", fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no run logged {key}", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle("dare compare: " + ", ".join(f"{r.path.name} ({r.recipe})" for r in runs), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_runs(folders: Sequence[str]) -> tuple[list[RunInfo], list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(RunInfo, config, metrics records) of each folder; a folder that is no run folder is an error."""
    runs, configs, records = [], [], []
    for folder in folders:
        path = Path(folder)
        info = read_run(path)
        if info is None:
            raise ValueError(f"{folder} is not a run folder (no readable config.json of `dare train`); "
                             "`dare runs DIR` lists the run folders in DIR")
        runs.append(info)
        configs.append(json.loads((path / "config.json").read_text()))
        records.append(read_jsonl(path / "metrics.jsonl"))
    return runs, configs, records


def _compare(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        raise ValueError(f"dare compare needs two run folders or more, got {len(args.runs)}")
    out = Path(args.output)
    if out.suffix.lower() != ".png":
        raise ValueError(f"--output {args.output}: the figure is a PNG; pass a path ending in .png")
    runs, configs, records = load_runs(args.runs)
    print(compare_text(runs, configs, records))
    print(f"\ncurves: {plot_compare(runs, records, out)}")
    return 0


def add_compare_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`dare compare RUN RUN ... [--output FILE.png]`."""
    p = sub.add_parser("compare", help="config differences, final metrics and overlaid curves of run folders",
                       description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (two or more)")
    p.add_argument("--output", default="compare.png", help="the figure to write (default compare.png)")
    p.set_defaults(func=_compare)


__all__ = ["PANELS", "add_compare_parser", "compare_text", "config_differences", "curve", "load_runs",
           "plot_compare"]

"""`dare runs [DIR]`: the run folders under DIR, one line each (recipe, steps, last reward, held-out
accuracy, status), read from what each folder holds.

A run folder is a folder with a `config.json` written by `dare train`. Its status:

- `running`: another process holds the folder's single-writer lock (`.lock`, an exclusive `flock`
  held for the life of the writing process; a lock file without a held `flock` is left from a
  process that is gone). Without lock support the pid recorded in the lock file is checked.
- `finished`: `summary.json` is there and the steps done reach the config's step budget.
- `interrupted`: stopped before its budget after at least one step (Ctrl-C, a kill, an error or a
  raised `trainer.max_steps`): a rerun into the folder resumes it from its last checkpoint.
- `failed`: stopped before its first step (only `config.json` and no metrics or checkpoint).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK = ".lock"
"""The single-writer lock file of a run folder."""

STATUSES = ("running", "finished", "interrupted", "failed")

_ACCURACY = re.compile(r"^eval(_accuracy|/.+_accuracy)$")


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What `dare runs` shows of one run folder.

    Attributes:
        path: the run folder.
        recipe, algorithm, kind: from its config.json (kind: quickstart, rl, sft or preference).
        steps_done, steps_total: steps of the run's last phase done (metrics or checkpoints) and
            its budget (`sft.steps` for SFT, else `trainer.max_steps`).
        reward: the last logged `reward_mean` (None: none logged).
        accuracy: the last held-out accuracy (mean over benchmarks; None: never evaluated).
        status: one of `STATUSES` (see the module docstring).
    """

    path: Path
    recipe: str
    algorithm: str
    kind: str
    steps_done: int
    steps_total: int
    reward: float | None
    accuracy: float | None
    status: str


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file, skipping a torn last line (a run killed mid-write)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def accuracy_of(record: dict[str, Any]) -> float | None:
    """The held-out accuracy of a metrics record: `eval_accuracy`, or the mean of its
    `eval/<benchmark>_accuracy` values; None when it has none."""
    values = [v for k, v in record.items() if _ACCURACY.match(k) and _finite(v)]
    return sum(values) / len(values) if values else None


def last_value(records: list[dict[str, Any]], key: str) -> float | None:
    """The last finite value of `key` in `records` (None: none)."""
    return next((float(r[key]) for r in reversed(records) if _finite(r.get(key))), None)


def _lock_held(folder: Path) -> bool:
    """Whether a live process holds the folder's lock."""
    path = folder / LOCK
    if not path.is_file():
        return False
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
    except (ImportError, OSError):  # no flock here: fall back to the recorded pid
        return _pid_alive(path)


def _pid_alive(path: Path) -> bool:
    try:
        pid = int(json.loads(path.read_text())["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _steps_done(folder: Path, records: list[dict[str, Any]], phase: str) -> int:
    """The steps done of phase `phase`: the last step of its `records` or of its checkpoints
    (`<order>-<phase>-<step>`; another phase's, e.g. the quick start's SFT warm start, never count)."""
    steps = [int(r["step"]) for r in records if _finite(r.get("step"))]
    done = max(steps, default=0)
    names = [p.name for p in (folder / "checkpoints").glob("*-*-*") if p.is_dir()]
    ckpt = [int(m.group(2)) for n in names if (m := re.fullmatch(r"\d+-([a-z]+)-(\d+)", n)) and m.group(1) == phase]
    return max([done, *ckpt])


def _summary_accuracy(path: Path, default: float | None) -> float | None:
    """The final held-out accuracy of a summary.json: the quick start's `eval_accuracy_after_rl`, or
    a checkpoint recipe's `results.final_eval` (mean over benchmarks); `default` when it has none."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return default
    if not isinstance(summary, dict):
        return default
    after = summary.get("eval_accuracy_after_rl")
    if isinstance(after, (int, float)) and _finite(after):
        return float(after)
    results = summary.get("results")
    final = results.get("final_eval") if isinstance(results, dict) else None
    found = accuracy_of(final) if isinstance(final, dict) else None
    return default if found is None else found


def _kind(algorithm: str) -> str:
    from dare.config import algorithm_kind

    try:
        return algorithm_kind(algorithm)
    except ValueError:  # an algorithm since renamed or removed
        return "?"


def read_run(folder: Path) -> RunInfo | None:
    """The `RunInfo` of `folder` (None: not a run folder, or its config.json is unreadable)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or "recipe" not in config:
        return None
    recipe, algorithm = str(config.get("recipe")), str(config.get("algorithm_name", ""))
    kind = "quickstart" if recipe == "quickstart" else _kind(algorithm)
    records = read_jsonl(folder / "metrics.jsonl")
    trainer, sft = config.get("trainer") or {}, config.get("sft") or {}
    phase = kind if kind in ("sft", "preference") else "rl"
    if kind == "quickstart" and not records:  # still in its SFT warm start
        records = read_jsonl(folder / "sft_metrics.jsonl")
        total, phase = int(sft.get("steps", 0)), "sft"
    else:
        total = int((sft if kind == "sft" else trainer).get("steps" if kind == "sft" else "max_steps", 0))
    done = _steps_done(folder, records, phase)
    accuracies = [a for r in records if (a := accuracy_of(r)) is not None]
    accuracy = accuracies[-1] if accuracies else None
    summary = folder / "summary.json"
    if summary.is_file():
        accuracy = _summary_accuracy(summary, accuracy)
    if _lock_held(folder):
        status = "running"
    elif summary.is_file() and done >= total:
        status = "finished"
    elif done > 0 or records:
        status = "interrupted"
    else:
        status = "failed"
    return RunInfo(path=folder, recipe=recipe, algorithm=algorithm, kind=kind, steps_done=done, steps_total=total,
                   reward=last_value(records, "reward_mean"), accuracy=accuracy, status=status)


def list_runs(root: Path) -> list[RunInfo]:
    """The run folders directly under `root` (or `root` itself when it is one), oldest first."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a folder; pass the folder that holds run folders (default runs/)")
    own = read_run(root)
    if own is not None:
        return [own]
    found = [r for p in root.iterdir() if p.is_dir() and (r := read_run(p)) is not None]
    return sorted(found, key=lambda r: ((r.path / "config.json").stat().st_mtime, r.path.name))


def _number(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if percent else f"{value:.3g}"


def format_runs(runs: list[RunInfo]) -> str:
    """A table of `runs`: folder, recipe, algorithm, steps done/total, last reward, held-out
    accuracy, status."""
    rows = [("run", "recipe", "algorithm", "steps", "reward", "held-out acc", "status")]
    rows += [(r.path.name, r.recipe, r.algorithm, f"{r.steps_done}/{r.steps_total}", _number(r.reward),
              _number(r.accuracy, percent=True), r.status) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _runs(args: argparse.Namespace) -> int:
    runs = list_runs(Path(args.dir))
    if not runs:
        print(f"no run folders in {args.dir} (a run folder holds the config.json of `dare train`)")
        return 0
    print(format_runs(runs))
    return 0


def add_runs_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """`dare runs [DIR]`."""
    p = sub.add_parser("runs", help="list run folders: recipe, steps, last reward, held-out accuracy, status",
                       description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("dir", nargs="?", default="runs", help="folder holding run folders (default runs/)")
    p.set_defaults(func=_runs)


__all__ = ["LOCK", "STATUSES", "RunInfo", "accuracy_of", "add_runs_parser", "format_runs", "last_value",
           "list_runs", "read_jsonl", "read_run"]

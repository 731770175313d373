"""Metrics: one JSON line per step, a progress bar, optional TensorBoard and W&B, PNG curves."""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dllm_train.folder_files import append_text, open_nofollow, replace_text, write_new

logger = logging.getLogger(__name__)

WANDB_INSTALL_HINT = "pip install 'dllm-train[wandb]' (in this workspace: uv sync --extra wandb --package dllm-train)"


def open_wandb(output_dir: Path, *, project: str, name: str = "", config: Mapping[str, Any] | None = None) -> Any:
    """Start (or resume) the W&B run of a training run folder; wandb is imported only here.

    Without WANDB_API_KEY and without an explicit WANDB_MODE the run is offline (nothing is sent,
    nothing blocks on the network); files go to `output_dir/wandb/` and `wandb sync` uploads them
    later. The run id is kept in `output_dir/wandb/run_id`, so rerunning the same command in the
    same folder continues the same W&B run (online; offline, every invocation writes its own
    folder under that id). Steps replayed after a resume are logged again.

    Args:
        output_dir: the run folder.
        project: W&B project.
        name: run name (empty: the folder's name).
        config: the resolved run config, stored with the W&B run.

    Returns:
        The `wandb.Run`.

    Raises:
        ImportError: wandb is not installed (the message says how to install the extra).
    """
    try:
        import wandb  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as err:
        raise ImportError(f"trainer.wandb=true needs the wandb package: {WANDB_INSTALL_HINT}, "
                          "or set trainer.wandb=false") from err
    root = output_dir / "wandb"
    root.mkdir(parents=True, exist_ok=True)
    id_file = root / "run_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    replace_text(id_file, run_id)
    offline = not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
    if offline:
        logger.info("W&B: no WANDB_API_KEY, logging offline to %s (upload later with `wandb sync`)", root)
    # wandb ignores `resume` offline (with a warning); online, "allow" continues the same run
    return wandb.init(project=project, name=name or output_dir.resolve().name, id=run_id,
                      resume=None if offline else "allow", dir=str(output_dir), config=dict(config or {}),
                      mode="offline" if offline else None)


class MetricsWriter:
    """Appends `{"step": ..., ...}` lines to a jsonl file; truncates past a resume point.

    No write follows a symbolic link (`dllm_train.folder_files`), and a write that fails (a full
    disk) raises one `FolderWriteError` naming the file and the free space.

    Args:
        path: the jsonl file.
        resume_step: records with a larger step are dropped (they belong to a lost future).
        tensorboard_dir: also write scalars to TensorBoard there.
        wandb_run: also log scalars to this W&B run, as `<phase>/<key>` against `<phase>/step`.
        phase: the prefix of the W&B keys.
    """

    def __init__(self, path: Path, *, resume_step: int = 0, tensorboard_dir: Path | None = None,
                 wandb_run: Any = None, phase: str = "train") -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            cut_torn_tail(path)
        kept = [r for r in read_metrics(path) if int(r["step"]) <= resume_step] if path.exists() else []
        tmp = path.with_suffix(".tmp")
        write_new(tmp, "".join(json.dumps(r) + "\n" for r in kept))  # never through a link planted there
        os.replace(tmp, path)  # replaces a link at `path` itself, not its target
        self._tb: Any = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:
                logger.warning("tensorboard is not installed; install dllm-train[tensorboard]")
        self._wandb = wandb_run
        self._phase = phase
        if wandb_run is not None:
            # phases restart their step count, so each phase gets its own step axis
            wandb_run.define_metric(f"{phase}/step")
            wandb_run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
        append_text(self.path, json.dumps(clean) + "\n")  # a full disk: one FolderWriteError naming the file
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, int(record["step"]))
        if self._wandb is not None:
            self._wandb.log({f"{self._phase}/step": int(record["step"]),
                             **{f"{self._phase}/{k}": v for k, v in scalars.items()}})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def host_peak_gib() -> float | None:
    """This process's peak resident memory in GiB since the last call, or None where unknown.

    Linux: the kernel's high-water mark `VmHWM` (/proc/self/status), reset after each reading
    (writing 5 to /proc/self/clear_refs), so each call covers the interval since the previous
    one; where the reset is refused, the peak since the process started. Other systems: the
    process's peak so far (`ru_maxrss`).
    """
    try:
        with open("/proc/self/status") as fh:
            kib = next((int(line.split()[1]) for line in fh if line.startswith("VmHWM:")), None)
    except OSError:
        kib = None
    if kib is None:
        import resource
        import sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return rss / 2**30 if sys.platform == "darwin" else rss / 2**20 if rss else None
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return kib / 2**20


def device_peak(prefix: str = "") -> dict[str, float]:
    """Peak memory since the last call: `peak_gib` (CUDA memory allocated; only on CUDA, its stats
    are reset) and `peak_rss_gib` (this process's resident host memory, `host_peak_gib`).

    Every training step reports them (an RL step per phase too, `rollout_` and `update_`
    prefixes), so a run's metrics.jsonl shows whether it fits its GPU and its host.

    Args:
        prefix: put before each key (e.g. "rollout_" -> `rollout_peak_gib`).
    """
    import torch

    out: dict[str, float] = {}
    if torch.cuda.is_available():
        out[f"{prefix}peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    host = host_peak_gib()
    if host is not None:
        out[f"{prefix}peak_rss_gib"] = host
    return out


def is_peak(key: str) -> bool:
    """Whether a metric is a memory peak (`device_peak`): combined over ranks and phases by max."""
    return key.endswith(("peak_gib", "peak_rss_gib"))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file.

    Raises:
        ValueError: a line is not a JSON record (the message names the file and the line).
    """
    out = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {n}, is not a JSON record ({err.msg}); a crash while it was written "
                             "leaves a torn last line, which resuming the run cuts: rerun the same command, or "
                             "delete the line") from None
    return out


def cut_torn_tail(path: Path) -> bool:
    """Cut a torn last line of a jsonl file (a crash mid-write: no newline, or no valid JSON);
    returns whether one was cut, logging one warning naming the file."""
    data = path.read_bytes()
    if not data.strip():
        return False
    body, _, last = data.rstrip(b"\n").rpartition(b"\n")
    head = body + b"\n" if body else b""
    try:
        torn = not data.endswith(b"\n") or (bool(last.strip()) and not isinstance(json.loads(last), dict))
    except ValueError:
        torn = True
    if not torn:
        return False
    fd = open_nofollow(path, os.O_RDWR)
    try:
        os.ftruncate(fd, len(head))
    finally:
        os.close(fd)
    logger.warning("%s: cut its torn last line (%d bytes, an interrupted write): %r", path, len(last), last[:80])
    return True


def format_line(record: dict[str, Any], keys: Sequence[str]) -> str:
    """A one-line summary `step 12 | reward_mean 0.531 | loss -0.012 ...`."""
    parts = [f"step {record['step']}"]
    for k in keys:
        if k in record and isinstance(record[k], (int, float)):
            parts.append(f"{k} {record[k]:.4g}")
    return " | ".join(parts)


Point = tuple[float, float, str]
"""(step, value, label): a marked point drawn on a metric's panel (e.g. the accuracy before RL)."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plotted_keys(records: Sequence[dict[str, Any]], keys: Sequence[str],
                 points: Mapping[str, Sequence[Point]] | None = None) -> list[str]:
    """The keys of `keys` that get a panel: those with a finite value in the records or among
    `points`. A flat curve keeps its panel (labelled as flat: an all-zero reward is what a user
    checks first); a key with no finite value has nothing to draw."""
    points = points or {}
    return [k for k in keys
            if any(_finite(r.get(k)) for r in records) or any(_finite(p[1]) for p in points.get(k, ()))]


def flat_value(records: Sequence[dict[str, Any]], key: str) -> float | None:
    """The one value of `key` when every finite value of it in `records` is the same (None: it
    varies, or it has none)."""
    values = {float(r[key]) for r in records if _finite(r.get(key))}
    return values.pop() if len(values) == 1 else None


def plot_curves(records: Sequence[dict[str, Any]], keys: Sequence[str], path: Path, *, title: str = "",
                points: Mapping[str, Sequence[Point]] | None = None) -> Path | None:
    """One PNG with a panel per metric of `keys` that has a value (`plotted_keys`); a flat one
    says so in its label (`key (flat at 0)`).

    Args:
        records: metric records, each with a `step`.
        keys: metrics to plot, top to bottom.
        path: the PNG to write.
        title: figure title (e.g. what the run shows).
        points: metric -> (step, value, label) points marked on its panel, such as the held-out
            accuracy before the first step.

    Returns:
        `path`, or None when no key has a panel (nothing is written).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = points or {}
    present = plotted_keys(records, keys, points)
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present) + (0.4 if title else 0)),
                             squeeze=False)
    for ax, key in zip(axes[:, 0], present):
        pts = [(r["step"], r[key]) for r in records if _finite(r.get(key))]
        marked = [(step, value) for step, value, _ in points.get(key, ()) if _finite(value)]
        line = sorted(pts + marked) if len(pts) < 20 else pts  # sparse curves run through their marks
        if line:
            ax.plot([p[0] for p in line], [p[1] for p in line], lw=0.8, label=key,
                    marker="." if len(line) < 20 else None)
        if len(pts) >= 20:
            w = max(5, len(pts) // 30)
            ys = [p[1] for p in pts]
            avg = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
            ax.plot([p[0] for p in pts], avg, lw=1.8, label=f"{key} (moving avg {w})")
        for step, value, label in points.get(key, ()):
            if _finite(value):
                ax.plot([step], [value], "o", ms=6, label=f"{label}: {value:.3g}")
        flat = flat_value(records, key) if len(pts) > 1 else None
        ax.set_ylabel(key if flat is None else f"{key}\n(flat at {flat:.3g})", fontsize=8)
        if flat is not None:
            ax.set_title(f"{key} is flat at {flat:.3g} over all {len(pts)} steps", fontsize=8, color="tab:red")
        ax.legend(loc="best", fontsize=7)
    from matplotlib.ticker import MaxNLocator

    for ax in axes[:, 0]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 0.5 ticks on short runs
    axes[-1, 0].set_xlabel("step")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

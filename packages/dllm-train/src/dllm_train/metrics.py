"""Metrics: one JSON line per step, a progress bar, optional TensorBoard, and PNG curves."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class MetricsWriter:
    """Appends `{"step": ..., ...}` lines to a jsonl file; truncates past a resume point."""

    def __init__(self, path: Path, *, resume_step: int = 0, tensorboard_dir: Path | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(path) if int(r["step"]) <= resume_step] if path.exists() else []
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(path)
        self._tb: Any = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except ImportError:
                logger.warning("tensorboard is not installed; install dllm-train[tensorboard]")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(clean) + "\n")
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, int(record["step"]))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def format_line(record: dict[str, Any], keys: Sequence[str]) -> str:
    """A one-line summary `step 12 | reward_mean 0.531 | loss -0.012 ...`."""
    parts = [f"step {record['step']}"]
    for k in keys:
        if k in record and isinstance(record[k], (int, float)):
            parts.append(f"{k} {record[k]:.4g}")
    return " | ".join(parts)


def plot_curves(records: Sequence[dict[str, Any]], keys: Sequence[str], path: Path) -> Path | None:
    """One PNG with a panel per metric in `keys` that the records carry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in records)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), squeeze=False)
    for ax, key in zip(axes[:, 0], present):
        pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=key)
        if len(pts) >= 20:
            w = max(5, len(pts) // 30)
            ys = [p[1] for p in pts]
            avg = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
            ax.plot([p[0] for p in pts], avg, lw=1.8, label=f"{key} (moving avg {w})")
        ax.set_ylabel(key)
        ax.legend(loc="best", fontsize=7)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

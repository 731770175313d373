"""Metric sinks a run config switches on beyond metrics.jsonl (TensorBoard is opened per phase by `Run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dare.config import RunConfig, to_dict
from dllm_train import open_wandb


def open_wandb_run(cfg: RunConfig, output_dir: Path) -> Any:
    """The W&B run of `trainer.wandb=true` (None when off), with the resolved config attached.

    Called before the model is loaded, so a missing package fails before any work.

    Raises:
        ValueError: wandb is not installed (the message names the extra to install).
    """
    t = cfg.trainer
    if not t.wandb:
        return None
    try:
        return open_wandb(output_dir, project=t.wandb_project, name=t.wandb_run_name, config=to_dict(cfg))
    except ImportError as err:
        raise ValueError(str(err)) from err

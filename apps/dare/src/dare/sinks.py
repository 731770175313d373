"""Metric sinks a run config switches on beyond metrics.jsonl (TensorBoard is opened per phase by `Run`),
and what a run's figures (`curves.png`, `reward.png`) show first and say in their title."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


FIRST = ("reward_mean",)
"""What a user checks first in a run's figure: the reward, then every held-out accuracy."""


def curve_keys(records: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """The panels of a run's figure, top to bottom: the reward (`FIRST`) when `records` or `keys`
    have it, every held-out accuracy the records logged (`eval_accuracy`, `eval/<name>_accuracy`),
    then the rest of `keys`."""
    from dare.runs import accuracy_of

    logged = {k for r in records for k in r}
    accuracy = sorted(k for k in logged if accuracy_of({k: 0.0}) is not None)
    first = [k for k in FIRST if k in keys or k in logged]
    ordered = [*first, *accuracy]
    return ordered + [k for k in keys if k not in ordered]


def drop_zero_panels(records: Sequence[dict[str, Any]], keys: Sequence[str],
                     keep: Sequence[str] = (*FIRST, "eval_accuracy", "loss"),
                     tolerance: Mapping[str, float] | None = None) -> tuple[list[str], list[str]]:
    """(drawn, dropped): `keys` without those whose every finite value is 0 (within `tolerance[key]`,
    default exactly), such as the `clip_frac` and `ppo_kl` of on-policy steps (the ratio is 1 by
    construction), which would spend a panel each on a flat line. `keep` are drawn even at 0 (an
    all-zero reward or loss is what a user checks first); a key with no value at all is left to
    `plot_curves` (no panel)."""
    tolerance = tolerance or {}

    def zero(key: str) -> bool:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
        return bool(values) and all(abs(v) <= tolerance.get(key, 0.0) for v in values)

    dropped = [k for k in keys if k not in keep and zero(k)]
    return [k for k in keys if k not in dropped], dropped


def curves_title(cfg: RunConfig, output_dir: Path, records: Sequence[dict[str, Any]], detail: str = "") -> str:
    """A run figure's title: recipe, algorithm and run folder; then `detail` or the last step's
    reward and held-out accuracy."""
    from dare.runs import accuracy_of, last_value

    head = f"{cfg.recipe} ({cfg.algorithm_name}) in {output_dir}"
    if not detail:
        steps = [int(r["step"]) for r in records if "step" in r]
        parts = [f"{max(steps)} steps"] if steps else []
        reward = last_value(list(records), "reward_mean")
        if reward is not None:
            parts.append(f"last reward {reward:.3g}")
        accuracies = [a for r in records if (a := accuracy_of(r)) is not None]
        if accuracies:
            parts.append(f"held-out accuracy {accuracies[-1]:.1%}")
        detail = ", ".join(parts)
    return f"{head}\n{detail}" if detail else head

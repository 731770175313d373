"""Learning-rate schedules: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math

from dllm_train.config import OptimConfig


def learning_rate(cfg: OptimConfig, step: int, *, total_steps: int = 0) -> float:
    """Learning rate of optimizer step `step` (0-based).

    Warm-up: lr * (step + 1) / warmup_steps for the first `warmup_steps` steps. Then "constant"
    keeps lr; "cosine" decays from lr to lr * min_lr_ratio over the steps after warm-up, reaching
    the floor at step `decay_steps` (or `total_steps`, the phase length, when decay_steps is 0)
    and staying there (Loshchilov & Hutter, arXiv 1608.03983, without restarts).

    Args:
        total_steps: the phase's number of steps, used when `cfg.decay_steps` is 0.
    """
    warm = cfg.warmup_steps
    if warm and step < warm:
        return cfg.lr * (step + 1) / warm
    if cfg.schedule == "constant":
        return cfg.lr
    horizon = cfg.decay_steps or total_steps
    if horizon <= 0:
        raise ValueError("optim.schedule='cosine' needs the decay horizon: set optim.decay_steps (e.g. to the "
                         "phase's number of steps)")
    progress = min(1.0, max(0, step - warm) / max(1, horizon - warm))
    floor = cfg.min_lr_ratio
    return cfg.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))

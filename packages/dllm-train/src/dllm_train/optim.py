"""The optimizer step of every phase (RL, SFT, preference): skip if non-finite, clip, schedule, AdamW.

One object, `OptimizerStep`, does what optax chains as `skip_not_finite(chain(clip_by_global_norm,
adamw, schedule))`: after the caller's backward it

1. checks the loss: a non-finite loss on any rank of `group` skips the step on every rank (a
   collective when `group` is set, so ranks whose gradient clipping is itself a collective skip
   together);
2. clips the gradients to `grad_clip` (their global norm; under FSDP2 the norm over all shards)
   and checks the norm, skipping the step on every rank if it is non-finite;
3. sets the learning rate of update `updates` (`schedule.learning_rate`; the counter counts the
   updates made, so a skipped step does not advance the schedule) and steps AdamW.

A skipped step clears the gradients and leaves the weights, the optimizer state and the counter
unchanged. It may be called several times per training step (one call per optimizer update):
`updates` counts the calls that stepped, and each call returns `optimizer_steps` (1 or 0) and
`skipped` (0 or 1) for the step's metrics.

`offload()` moves the optimizer state to host memory until something reads it
(`dllm_train.offload`, `trainer.optimizer_offload`): the AdamW update (after the clipping, which
reads only gradients), `state()` and `load_state()` restore it first. A skipped step leaves it
offloaded.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.distributed as dist

from dllm_train.config import OptimConfig
from dllm_train.lockstep import group_all
from dllm_train.offload import HostOffload, state_tensors
from dllm_train.schedule import learning_rate

logger = logging.getLogger(__name__)


def build_optimizer(model: Any, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters of `model` (LoRA: the adapters only)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


class OptimizerStep:
    """AdamW on a model's trainable parameters, with clipping, schedule and non-finite skip.

    Args:
        model: the trained module (its parameters with `requires_grad` are optimised).
        cfg: optimizer settings (lr, betas, weight decay, grad_clip, warm-up and schedule).
        horizon: the phase's number of updates, the cosine's horizon when `cfg.decay_steps` is 0
            (0: unknown; a cosine schedule then needs `cfg.decay_steps`).
        group: the process group whose ranks must skip together (None: this process alone).

    Attributes:
        host: where `offload` keeps the optimizer state.
        restore_s: seconds spent bringing it back, summed over the run.
    """

    def __init__(self, model: Any, cfg: OptimConfig, *, horizon: int = 0,
                 group: dist.ProcessGroup | None = None) -> None:
        self.model = model
        self.cfg = cfg
        self.horizon = horizon
        self.group = group
        self.optimizer = build_optimizer(model, cfg)
        self.updates = 0
        self.skipped = 0
        self.host = HostOffload()
        self.restore_s = 0.0

    def zero_grad(self) -> None:
        """Clear the gradients before the step's backward passes."""
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        """The learning rate of the next update."""
        return learning_rate(self.cfg, self.updates, total_steps=self.horizon)

    def step(self, loss: float | torch.Tensor) -> dict[str, float]:
        """Skip, or clip and update, after the backward of `loss` (already run by the caller).

        Args:
            loss: the step's loss (a scalar; only its finiteness is read).

        Returns:
            `grad_norm` (before clipping; absent when the loss skipped the step), `lr` (of the
            update made, or that would have been made), `optimizer_steps` (1 or 0) and `skipped`
            (0 or 1).
        """
        out: dict[str, float] = {"lr": self.lr()}
        if not group_all(math.isfinite(float(loss)), self.group):
            return self._skip(out, "loss")
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0
        out["grad_norm"] = norm
        if not group_all(math.isfinite(norm), self.group):
            return self._skip(out, "gradient norm")
        for g in self.optimizer.param_groups:
            g["lr"] = out["lr"]
        self.restore()
        self.optimizer.step()
        self.updates += 1
        out.update(optimizer_steps=1.0, skipped=0.0)
        return out

    def _skip(self, out: dict[str, float], what: str) -> dict[str, float]:
        self.zero_grad()
        self.skipped += 1
        logger.warning("non-finite %s: optimizer step skipped, weights and optimizer state unchanged", what)
        out.update(optimizer_steps=0.0, skipped=1.0)
        return out

    def offload(self) -> None:
        """Move the optimizer state's device tensors to host memory until it is read again
        (`HostOffload.offload`; idempotent)."""
        self.host.offload(state_tensors(self.optimizer))

    def restore(self) -> None:
        """Bring an offloaded optimizer state back (a no-op otherwise); its seconds add to `restore_s`."""
        self.restore_s += self.host.restore()

    def state(self) -> dict[str, Any]:
        """The optimizer state and the counters, for checkpoints."""
        self.restore()
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates, "skipped": self.skipped}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`. A state without counters (SFT and preference checkpoints written
        before this component) takes `updates` from AdamW's own step count."""
        self.restore()  # the state loads into resident tensors, and no slot outlives them
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_counters(state)

    def load_counters(self, state: dict[str, Any]) -> None:
        """The counters of `state` (the optimizer state is loaded elsewhere, e.g. from shards)."""
        self.restore()  # AdamW's step count may be read
        self.updates = int(state["updates"]) if "updates" in state else adam_steps(self.optimizer)
        self.skipped = int(state.get("skipped", 0))


def adam_steps(optimizer: torch.optim.Optimizer) -> int:
    """The number of updates AdamW has made (its per-parameter `step`; 0 before the first)."""
    for s in optimizer.state.values():
        if "step" in s:
            return int(float(s["step"]))
    return 0


__all__ = ["OptimizerStep", "adam_steps", "build_optimizer"]

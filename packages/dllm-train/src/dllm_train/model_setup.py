"""Model setup of the likelihood passes: attention backend, activation checkpointing, reference scorers.

What a rank decides about its models before any pass runs, shared by the local and Ray backends
(`dllm_train.assembly`) and the offline SFT / preference phases.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_models.activation_memory import GIB, ActivationBudget, ActivationPlanner
from dllm_train.config import TrainerConfig
from dllm_train.likelihood import Scorer


def resolved_attention(trainer: TrainerConfig, model: Any) -> str | None:
    """The packed attention backend of the likelihood passes: `trainer.train_attention`, where
    "auto" picks the exact fast path of the device (CUDA: varlen for bidirectional families,
    the BD3LM kernel `bd3lm_kernel` for block families: SDAR-8B's RL recipe update at the recipe's
    batch took 404 s with it against 514 s with flex on the H200, docs/benchmarks.md; CPU: sdpa
    for block families, whose padded layout runs one row per noised block, and the padded path
    for bidirectional ones), and "none" or "" the padded path. `flex` and `sdpa` stay
    selectable by name."""
    choice = trainer.train_attention
    if choice in ("", "none"):
        return None
    if choice != "auto":
        return choice
    block = model.traits.block_length is not None
    device = next(model.parameters()).device
    if device.type != "cuda":
        return "sdpa" if block else None
    return "bd3lm_kernel" if block else "varlen"


def set_activation_checkpointing(model: Any, enabled: bool, *, memory_gib: float | None = None) -> None:
    """Recompute decoder layers' activations in backward (the families' own switch).

    Args:
        model: a family module.
        enabled: checkpoint at all.
        memory_gib: size the checkpointing to this memory budget (`trainer.activation_memory_gib`;
            0: the device's memory): only as many layers as it needs are recomputed
            (`dllm_models.ActivationPlanner`). None: every layer.
    """
    if not hasattr(model, "gradient_checkpointing"):
        if enabled:
            raise ValueError(f"{type(model).__name__} has no activation checkpointing; "
                             "set trainer.activation_checkpointing=false")
        return
    model.gradient_checkpointing = bool(enabled)
    planner = None
    if enabled and memory_gib is not None:
        budget = ActivationBudget(budget_bytes=None if memory_gib == 0 else int(memory_gib * GIB))
        planner = ActivationPlanner(budget)
    model.activation_planner = planner


class BaseWeightsScorer(Scorer):
    """A `Scorer` of a LoRA model's base weights: every adapter off during its calls.

    Under LoRA the reference policy is the frozen base model, which the policy already holds:
    scoring it this way costs no second copy of the weights.
    """

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        from dllm_models import adapters_disabled

        with adapters_disabled(self.model):
            return super().__call__(noisy_ids, attention_mask, targets, clean_ids=clean_ids, temperature=temperature)


class OffloadedScorer(Scorer):
    """A `Scorer` of a frozen model kept on the CPU, moved to the accelerator for each call.

    The memory lever for a reference model that would otherwise cost a second full copy on the
    GPU: between its passes it holds no device memory (the moves cost a transfer per call). For
    an unsharded model only: an FSDP2-sharded reference is offloaded by FSDP2 itself
    (`CPUOffloadPolicy`, see `dllm_train.assembly.assemble_rank`).
    """

    def __init__(self, model: Any, *, attention: str | None = None, device: str | None = None,
                 shared_context: bool = True) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        super().__init__(model.to("cpu"), attention=attention, shared_context=shared_context)

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        self.model.to(self.device)
        try:
            return super().__call__(noisy_ids.to(self.device), attention_mask.to(self.device), targets.to(self.device),
                                    clean_ids=None if clean_ids is None else clean_ids.to(self.device),
                                    temperature=temperature)
        finally:
            self.model.to("cpu")


__all__ = ["BaseWeightsScorer", "OffloadedScorer", "resolved_attention", "set_activation_checkpointing"]

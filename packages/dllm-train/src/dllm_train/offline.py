"""Training on fixed batches (SFT, preference): one worker for every `OfflineObjective`.

The worker runs the passes and the optimizer step; the algorithm (an `OfflineObjective`, such as
the SFT and preference classes of `dllm_algorithms`) owns its masks and its loss. One step:

1. `batches(step)` and `objective.prepare(batch, generator(seed, objective.noise_stream, step))`;
2. when `objective.needs_reference`: the reference values, without grad, in token-budget passes;
3. `accumulate` backpropagates `objective.loss(objective.values(...), inputs)` pass by pass
   (`dllm_train.passes`; `objective.row_local` picks the scheme), so the gradient equals the
   single-batch one;
4. `OptimizerStep`: skip if non-finite, clip, schedule, AdamW.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from dllm_train.config import OptimConfig
from dllm_train.likelihood import Scorer
from dllm_train.metrics import device_peak
from dllm_train.model_setup import BaseWeightsScorer, OffloadedScorer
from dllm_train.objective import OfflineInputs, OfflineObjective
from dllm_train.optim import OptimizerStep
from dllm_train.passes import ValuesScorer, accumulate, evaluate, token_budget
from dllm_train.seeding import generator

B = TypeVar("B")
D = TypeVar("D")


def _reference_scorer(model: Any, ref_model: Any, *, attention: str | None, offload: bool) -> Scorer:
    """The reference's scorer: the policy's base weights when `ref_model` is the LoRA policy itself, else a frozen
    `ref_model` (offloaded to the CPU between passes when `offload`)."""
    from dllm_models import has_adapters

    if ref_model is model:
        if not has_adapters(model):
            raise ValueError("ref_model is the policy itself, which is the initial policy only under LoRA (its base "
                             "weights); pass a frozen copy of the initial policy for full fine-tuning")
        return BaseWeightsScorer(model, attention=attention)
    ref_model.eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    return OffloadedScorer(ref_model, attention=attention) if offload else Scorer(ref_model, attention=attention)


class OfflineWorker(Generic[B, D]):
    """The trainable policy (and a frozen reference when the objective needs one); one step per call.

    Args:
        model: trainable policy (adapters already injected for LoRA).
        objective: the algorithm: masks, values and loss.
        batches: step -> batch, deterministic in step.
        optim: optimizer settings.
        seed: root seed of the noise.
        steps: the phase's number of steps (the horizon of a cosine schedule without decay_steps).
        ref_model: the frozen reference (the initial policy), required when
            `objective.needs_reference`; frozen here. `model` itself under LoRA: its base weights
            (adapters off, `BaseWeightsScorer`), so no second copy is held (the RL assembly's rule).
        reference_offload: keep a separate reference on the CPU between its passes (`OffloadedScorer`).
        attention: packed attention backend of the policy and reference passes (None: padded).
        scorer: how the policy is run (default `Scorer(model, attention=attention)`).
        max_tokens_per_pass: token budget of one forward (0: each scorer call at once); the
            gradient equals the single-batch one (`dllm_train.passes`).
    """

    def __init__(self, model: Any, objective: OfflineObjective[B, D], batches: Callable[[int], B],
                 optim: OptimConfig, *, seed: int, steps: int = 0, ref_model: Any = None,
                 reference_offload: bool = False, attention: str | None = None, scorer: Scorer | None = None,
                 max_tokens_per_pass: int = 0) -> None:
        if objective.needs_reference and ref_model is None:
            raise ValueError(f"{objective.label} compares with a reference model; pass ref_model (a frozen copy of "
                             "the initial policy)")
        self.model = model
        self.objective = objective
        self.batches = batches
        self.steps = steps
        self.seed = seed
        self.max_tokens = token_budget(max_tokens_per_pass)
        self.optim = OptimizerStep(model, optim, horizon=steps)
        self.optimizer = self.optim.optimizer
        self.scorer = scorer if scorer is not None else Scorer(model, attention=attention)
        self.ref_model = ref_model
        self.ref_scorer: Scorer | None = None
        if objective.needs_reference:
            self.ref_scorer = _reference_scorer(model, ref_model, attention=attention, offload=reference_offload)

    def _prepare(self, step: int) -> tuple[B, D, torch.Tensor | None]:
        """(batch, data, reference values or None) of step `step`."""
        obj = self.objective
        batch = self.batches(step)
        data = obj.prepare(batch, generator(self.seed, obj.noise_stream, step))
        if self.ref_scorer is None:
            return batch, data, None

        def reference(scorer: ValuesScorer) -> torch.Tensor:
            return obj.reference_values(scorer, batch, data)
        return batch, data, evaluate(reference, self.ref_scorer, self.max_tokens)[0]

    def values(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(policy values, reference values or None) of step `step`, without grad."""
        batch, data, ref = self._prepare(step)

        def policy(scorer: ValuesScorer) -> torch.Tensor:
            return self.objective.values(scorer, batch, data)
        return evaluate(policy, self.scorer, self.max_tokens)[0], ref

    def loss(self, step: int) -> torch.Tensor:
        """The loss of step `step` (with gradient, one forward per scorer call)."""
        batch, data, ref = self._prepare(step)
        return self.objective.loss(self.objective.values(self.scorer, batch, data), OfflineInputs(batch, data, ref))[0]

    def step(self, step: int) -> dict[str, float]:
        """One optimizer step on the batch of step `step`.

        Returns:
            loss, grad_norm, optimizer_steps, skipped, the objective's metrics and (on CUDA) peak_gib.
        """
        obj = self.objective
        self.model.train()
        batch, data, ref = self._prepare(step)
        inputs = OfflineInputs(batch, data, ref)

        def values(scorer: ValuesScorer) -> torch.Tensor:
            return obj.values(scorer, batch, data)

        def loss_fn(v: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return obj.loss(v, inputs)

        self.optim.zero_grad()
        result = accumulate(values, loss_fn, self.scorer, max_tokens=self.max_tokens, row_local=obj.row_local)
        loss = float(result.loss)
        stepped = self.optim.step(loss)
        return {"loss": loss, **{k: v for k, v in stepped.items() if k != "lr"},
                **{k: float(v) for k, v in result.metrics.items()}, **device_peak()}

    def state(self) -> dict[str, Any]:
        return self.optim.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.optim.load_state(state)


__all__ = ["OfflineWorker"]

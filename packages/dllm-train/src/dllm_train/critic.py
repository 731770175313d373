"""The value model (critic) of actor-critic RL: its scorer and its worker.

An algorithm that declares a value model (`RLAlgorithm.critic`, a `CriticSpec`) gets a
`ValueWorker` beside its actor: a `dllm_models.ValueModel` (a copy of the initial policy with a
zero-initialised scalar head), its own AdamW (the actor's settings at the critic's learning rate)
and its own passes over the algorithm's rows. The worker knows no algorithm: the algorithm says
which rows the value model scores (`critic_values`, through a `ValueScorer`, the same rows and
BD3LM layout as its policy values), what the policy's advantages and the value model's targets are
(`critic_targets`) and the value loss (`critic_loss`). One step (`dllm_train.step.PolicyRank`):
old values after `prepare`; targets once the batch's advantages are known; the policy's update
with them (`LossInputs.critic`); then the value model's update, every `CriticSpec.every` steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

import torch

from dllm_train.algorithm import CriticInputs, CriticTargets, Prepared, RLAlgorithm
from dllm_train.config import OptimConfig
from dllm_train.likelihood import Scorer
from dllm_train.packed_scoring import Readout
from dllm_train.optim import OptimizerStep
from dllm_train.passes import ValuesFn, ValuesScorer, accumulate, evaluate, token_budget

D = TypeVar("D")


def position_values(model: Any, input_ids: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                    **forward_kwargs: Any) -> torch.Tensor:
    """A value model's values ``[B, L]`` of one forward, 0 where ``targets < 0`` (the
    `dllm_train.packed_scoring.Readout` of `ValueScorer`; `temperature` is a log-prob setting, unused).

    Logit-shifted families read position ``j``'s value at ``j - 1``, restarting at every packed
    sequence (`dllm_models.logprob.shift_hidden`), as their log-probs are read.
    """
    from dllm_models.logprob import shift_hidden

    values: torch.Tensor = model(input_ids, **forward_kwargs)
    if int(getattr(model.traits, "logit_shift", 0) or 0):
        values = shift_hidden(values[..., None], forward_kwargs.get("attention"))[..., 0]
    dtype = torch.promote_types(values.dtype, torch.float32)
    return torch.where(targets >= 0, values.to(dtype), torch.zeros((), dtype=dtype, device=values.device))


class ValueScorer(Scorer):
    """A `Scorer` of a value model: each call returns the per-position values ``[M, S]`` instead of
    log-probs, on the same rows (block families: the BD3LM rows of `Scorer`, each noised block
    seeing itself and the clean earlier blocks; logit-shifted families: position ``j`` read at
    ``j - 1``, where its prediction lives). The targets only shape the output.

    Args:
        model: a `dllm_models.ValueModel` (its forward returns ``[M, S]`` values).
        attention: the packed training attention backend, as for `Scorer` (the policy's:
            `dllm_train.resolved_attention`); None: the padded path.
        shared_context: as for `Scorer`.
    """

    def __init__(self, model: Any, *, attention: str | None = None, shared_context: bool = True) -> None:
        super().__init__(model, attention=attention, shared_context=shared_context)

    def packed_readout(self) -> Readout:
        return position_values

    def _token_logp(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
        if targets.dim() != ids.dim():
            raise ValueError(f"a value model scores positions, not candidate tokens: targets of shape "
                             f"{tuple(targets.shape)} for inputs of shape {tuple(ids.shape)}")
        values: torch.Tensor = self.model(ids, attention_mask=attn, position_ids=pos)
        if self.logit_shift:
            values = torch.cat([values[:, :1], values[:, :-1]], dim=1)
        return values.to(self.value_dtype)


class ValueWorker(Generic[D]):
    """Holds the value model and its optimizer; computes its old values and updates it.

    Args:
        model: the value model (`dllm_models.ValueModel`).
        algorithm: an RL algorithm whose `critic` is set.
        optim: the actor's optimizer settings; the value model's are these at `critic.lr`.
        scorer: how the value model is run (default `ValueScorer(model)`).
        max_tokens_per_pass: token budget of one forward (0: one forward per scorer call).
        optimizer_offload: keep the value model's optimizer state in host memory between its
            optimizer steps (`trainer.optimizer_offload`, `offload_optimizer`).
    """

    def __init__(self, model: Any, algorithm: RLAlgorithm[D], optim: OptimConfig, *,
                 scorer: Scorer | None = None, max_tokens_per_pass: int = 0, optimizer_offload: bool = False) -> None:
        spec = algorithm.critic
        if spec is None:
            raise ValueError(f"algorithm {algorithm.label} declares no value model (its critic is None); "
                             "build a ValueWorker only for an algorithm with one")
        self.model = model
        self.algorithm = algorithm
        self.spec = spec
        self.scorer = scorer if scorer is not None else ValueScorer(model)
        self.optim = OptimizerStep(model, dataclasses.replace(optim, lr=spec.lr), group=self.scorer.lockstep_group)
        self.max_tokens = token_budget(max_tokens_per_pass)
        self.optimizer_offload = optimizer_offload

    def _values_fn(self, prepared: Prepared[D]) -> ValuesFn:
        alg = self.algorithm

        def fn(scorer: ValuesScorer) -> torch.Tensor:
            return alg.critic_values(scorer, prepared.batch, prepared.data)
        return fn

    def old_values(self, prepared: Prepared[D]) -> torch.Tensor:
        """The value model's values on the prepared rows, without grad (eval mode)."""
        was_training = self.model.training
        self.model.eval()
        values, _ = evaluate(self._values_fn(prepared), self.scorer, self.max_tokens)
        self.model.train(was_training)
        return values

    def targets(self, prepared: Prepared[D], old: torch.Tensor, advantages: torch.Tensor) -> CriticTargets:
        """The algorithm's advantages and returns from the old values (`RLAlgorithm.critic_targets`)."""
        return self.algorithm.critic_targets(prepared.batch, prepared.data, old, advantages)

    def due(self, step: int) -> bool:
        """Whether the value model trains at (0-based) `step`: the 1-based step is a multiple of `every`."""
        return (step + 1) % self.spec.every == 0

    def update(self, prepared: Prepared[D], old: torch.Tensor, targets: CriticTargets) -> dict[str, float]:
        """One optimizer step of the value model on `critic_loss`; a non-finite loss or gradient skips it.

        Returns:
            the loss's metrics, with `value_grad_norm`, `value_optimizer_steps` and `value_skipped`.
        """
        alg = self.algorithm
        self.model.train()
        self.optim.zero_grad()

        def loss_fn(values: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return alg.critic_loss(values, CriticInputs(batch=prepared.batch, data=prepared.data, old=old,
                                                        targets=targets))

        result = accumulate(self._values_fn(prepared), loss_fn, self.scorer, max_tokens=self.max_tokens,
                            row_local=self.spec.row_local)
        out = {k: float(v) for k, v in result.metrics.items()}
        stepped = self.optim.step(float(result.loss))
        out.update({f"value_{k}": v for k, v in stepped.items()})
        self.optim.zero_grad()
        return out

    def offload_optimizer(self) -> bool:
        """Move the value model's optimizer state to host memory until its next optimizer step reads it
        (`OptimizerStep.offload`); whether it did (False unless `optimizer_offload`)."""
        if self.optimizer_offload:
            self.optim.offload()
        return self.optimizer_offload

    def state(self) -> dict[str, Any]:
        """The value model's weights, its optimizer state and counters (tensors and plain data)."""
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return {"model": weights, **self.optim.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`: the weights (strict) and the optimizer state."""
        self.model.load_state_dict(state["model"], strict=True)
        self.optim.load_state(state)


__all__ = ["ValueScorer", "ValueWorker", "position_values"]

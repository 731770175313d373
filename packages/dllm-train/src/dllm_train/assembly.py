"""Rank assembly: the workers of one RL rank, built by one rule for the local and Ray backends.

`assemble_rank` decides which copies of the policy a rank holds and how each is scored:

- the actor trains `model` (sharded by the `shard` hook on Ray);
- the rollout decodes `model` itself (local) or an unsharded replica (when `shard` is given: a
  sharded model cannot decode without collectives);
- the reference, for algorithms with `needs_reference`: under LoRA the policy's own base weights
  with the adapters off (`BaseWeightsScorer`, no copy); otherwise a frozen copy of the initial
  policy, which `trainer.reference_offload` keeps on the CPU between its passes (`OffloadedScorer`
  locally; FSDP2's `CPUOffloadPolicy` on the sharded reference);
- the rollout's reference, for algorithms with `needs_rollout_reference`: the rollout model's base
  weights under LoRA, else a frozen copy (locally the reference's own copy);
- the value model, for algorithms with a `critic`: a `dllm_models.ValueModel` on a copy of the
  initial policy, trained by its own `dllm_train.critic.ValueWorker` (one process only: refused
  with `shard`, and under LoRA).

The backends pass only what differs as hooks: `shard` (FSDP2 wrapping) and `scorer` (lockstep and
sequence-parallel scorers). Copies are made from the full model and a sharded one is sharded at
once (reference, then the rollout's replicas, then the policy), so at most two full copies sit on
a device at any moment (three with a rollout reference).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import torch

from dllm_models import BaseWeightsView, ValueModel, has_adapters
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train.algorithm import RLAlgorithm
from dllm_train.config import OptimConfig, TrainerConfig
from dllm_train.critic import ValueScorer, ValueWorker
from dllm_train.engine_rollout import build_rollout_worker
from dllm_train.likelihood import Scorer
from dllm_train.model_setup import BaseWeightsScorer, OffloadedScorer, resolved_attention, set_activation_checkpointing
from dllm_train.step import PolicyRank
from dllm_train.workers import ActorWorker, ReferenceWorker, RewardWorker


class Shard(Protocol):
    """Wraps a model that is trained or scored sharded (FSDP2 on Ray); `offload` keeps it on the CPU."""

    def __call__(self, model: Any, *, offload: bool) -> Any: ...


class ScorerFactory(Protocol):
    """Builds the scorer of one of the rank's models; `kind` is `Scorer`, `BaseWeightsScorer` or
    `OffloadedScorer` (the assembly's choice; a backend may run `Scorer`s its own way)."""

    def __call__(self, model: Any, *, kind: type[Scorer], attention: str | None, shared_context: bool) -> Scorer: ...


def plain_scorer(model: Any, *, kind: type[Scorer], attention: str | None, shared_context: bool) -> Scorer:
    """The scorer of one process: `kind(model, attention=..., shared_context=...)`."""
    return kind(model, attention=attention, shared_context=shared_context)


def assemble_rank(model: Any, *, sampling: SamplingConfig, algorithm: RLAlgorithm[Any], optim: OptimConfig,
                  trainer: TrainerConfig, reward: RewardWorker, plan_generator: Callable[[int], torch.Generator],
                  engine_folder: str | None = None, shard: Shard | None = None, scorer: ScorerFactory = plain_scorer,
                  generates: bool = True, share: Callable[[Any], Any] | None = None,
                  save_rollout: Callable[[int, RolloutBatch], None] | None = None) -> PolicyRank[Any]:
    """The `PolicyRank` of one rank around `model`: its actor, rollout and reference workers (see the
    module docstring) and `reward`.

    Args:
        model: the initial policy, unsharded, on this rank's device (trained in place, or
            sharded in place by `shard`).
        sampling: the rollout's decoding settings.
        algorithm: the RL algorithm (its `needs_reference` / `needs_rollout_reference`).
        optim: the actor's optimizer settings.
        trainer: token budget, training attention, BD3LM layout, the memory levers
            (`activation_checkpointing`, `reference_offload`, `fsdp_cpu_offload`,
            `optimizer_offload`) and the consistency period (`consistency_every`).
        reward: the rank's verifier.
        plan_generator: step -> the generator of this rank's `prepare` noise.
        engine_folder: the checkpoint folder an inference engine loads (`build_rollout_worker`).
        shard: wraps the policy and the reference copy (None: one process, nothing sharded).
        scorer: builds each model's scorer.
        generates, share: sequence parallelism: whether this rank decodes, and how the group's
            leader hands its rollout to the others (see `PolicyRank`).
        save_rollout: stores each decoded rollout (`dllm_train.RolloutSaver`; None: nothing stored).

    Returns:
        the rank's `PolicyRank`; its trained model is `rank.actor.model` (as `shard` returned it).
    """
    lora = has_adapters(model)
    attention = resolved_attention(trainer, model)
    shared = trainer.bd3lm_layout == "shared"
    budget = trainer.max_tokens_per_pass
    ref_copy: Any = None
    if algorithm.needs_reference and not lora:
        ref_copy = copy.deepcopy(model)
        if shard is not None:
            ref_copy = shard(ref_copy, offload=trainer.fsdp_cpu_offload or trainer.reference_offload)
    critic = _value_worker(model, algorithm, optim, trainer, shard=shard, lora=lora, attention=attention, shared=shared)
    rollout_model = model if shard is None else copy.deepcopy(model)
    rollout_ref: Any = None
    if algorithm.needs_rollout_reference:
        if lora:  # the rollout model's base weights (adapters off) are the initial policy
            rollout_ref = BaseWeightsView(rollout_model)
        else:
            rollout_ref = ref_copy if shard is None and ref_copy is not None else _frozen_copy(model)
    set_activation_checkpointing(model, trainer.activation_checkpointing, memory_gib=trainer.activation_memory_gib)
    policy = model if shard is None else shard(model, offload=trainer.fsdp_cpu_offload)
    actor: ActorWorker[Any] = ActorWorker(policy, algorithm, optim, max_tokens_per_pass=budget,
                                          scorer=scorer(policy, kind=Scorer, attention=attention, shared_context=shared),
                                          optimizer_offload=trainer.optimizer_offload)
    reference = None
    if algorithm.needs_reference and lora:  # the trained policy's base weights: no copy
        reference = ReferenceWorker(policy, max_tokens_per_pass=budget, freeze=False, scorer=scorer(
            policy, kind=BaseWeightsScorer, attention=attention, shared_context=shared))
    elif ref_copy is not None:
        kind = OffloadedScorer if trainer.reference_offload and shard is None else Scorer
        reference = ReferenceWorker(ref_copy, max_tokens_per_pass=budget, scorer=scorer(
            ref_copy, kind=kind, attention=attention, shared_context=shared))
    rollout = build_rollout_worker(rollout_model, sampling, algorithm=algorithm, ref_model=rollout_ref,
                                   engine_folder=engine_folder)
    return PolicyRank(rollout=rollout, reward=reward, actor=actor, reference=reference, plan_generator=plan_generator,
                      consistency_every=trainer.consistency_every, generates=generates, share=share,
                      save_rollout=save_rollout, critic=critic)


def _value_worker(model: Any, algorithm: RLAlgorithm[Any], optim: OptimConfig, trainer: TrainerConfig, *,
                  shard: Shard | None, lora: bool, attention: str | None, shared: bool) -> ValueWorker[Any] | None:
    """The value model's worker of an algorithm with a `critic` (None without): a `ValueModel` on a
    copy of the initial policy, at the actor's token budget, training attention (packed rows, the
    BD3LM layout) and activation checkpointing."""
    if algorithm.critic is None:
        return None
    if shard is not None:
        raise ValueError(f"algorithm {algorithm.label} trains a value model, which runs on the local backend only: "
                         "set trainer.backend=local (or turn the algorithm's value model off)")
    if lora:
        raise ValueError(f"algorithm {algorithm.label} trains a value model, a full copy of the policy, which LoRA "
                         "adapters (checkpoint.lora_rank > 0) do not cover: set checkpoint.lora_rank=0 (or turn the "
                         "algorithm's value model off)")
    value = ValueModel.from_policy(model)
    set_activation_checkpointing(value.backbone, trainer.activation_checkpointing,
                                 memory_gib=trainer.activation_memory_gib)
    return ValueWorker(value, algorithm, optim, max_tokens_per_pass=trainer.max_tokens_per_pass,
                       scorer=ValueScorer(value, attention=attention, shared_context=shared),
                       optimizer_offload=trainer.optimizer_offload)


def _frozen_copy(model: Any) -> Any:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


__all__ = ["ScorerFactory", "Shard", "assemble_rank", "plain_scorer"]

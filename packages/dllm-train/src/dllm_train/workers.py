"""Workers: rollout, reward, actor and reference, each a plain object around one job.

The same classes run in-process (one rank) and inside Ray actors (`dllm_train.distributed`), so
the update a user debugs locally is the update that runs distributed. None of them knows which
algorithm it runs: everything algorithm-specific comes from the `RLAlgorithm` object, through
typed fields (`RLBatch`, `Prepared`, `LossInputs`). Every likelihood pass (old, reference,
training) runs in token-budget passes (`dllm_train.passes`), so memory is bounded by
`max_tokens_per_pass` whatever the batch, Monte-Carlo budget or replay length.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from dllm_models import BaseWeightsView, merged_adapters
from dllm_rollout import RolloutBatch, SamplingConfig, left_pad, on_model_grid, record_settings
from dllm_train.algorithm import CriticTargets, LossInputs, Prepared, RLAlgorithm, RLBatch, SpecialTokens
from dllm_train.config import OptimConfig
from dllm_train.likelihood import Scorer
from dllm_train.minibatch import mean_metrics, mini_batches
from dllm_train.passes import ValuesFn, ValuesScorer, accumulate, evaluate, token_budget
from dllm_train.optim import OptimizerStep
from dllm_train.rollout_record import check_rollout_record

logger = logging.getLogger(__name__)
D = TypeVar("D")


def sequence_inputs(rollout: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, prompt_valid, response_valid), all [B, P + R]."""
    zeros_p = torch.zeros_like(rollout.prompt_mask)
    zeros_r = torch.zeros_like(rollout.response_mask)
    prompt_valid = torch.cat([rollout.prompt_mask, zeros_r], dim=1)
    response_valid = torch.cat([zeros_p, rollout.response_mask], dim=1)
    return rollout.input_ids, rollout.attention_mask, prompt_valid, response_valid


def special_tokens(model: Any) -> SpecialTokens:
    """The model's special ids (`model.traits`)."""
    t = model.traits
    return SpecialTokens(mask_id=int(t.mask_token_id), eos_id=int(t.eos_token_id), pad_id=int(t.pad_token_id))


def sampling_for(model: Any, sampling: SamplingConfig, algorithm: RLAlgorithm[Any] | None) -> SamplingConfig:
    """The run's SamplingConfig on the model's grid (`dllm_rollout.on_model_grid`: a block model refuses another
    `block_length`) with the algorithm's records (its `sampling`, and the switches its `record_fields` need)."""
    out = on_model_grid(sampling, model.traits.block_length)
    if algorithm is None:
        return out
    return record_settings(algorithm.sampling(out), algorithm.record_fields)


class RolloutWorker:
    """Generates responses with the current policy weights.

    Args:
        model: the policy module (shared with the actor in one process).
        sampling: the run's decoding settings (`max_rows` > 0 decodes that many rows at a time).
        algorithm: its `sampling` records and `generate` are used.
        ref_model: a frozen reference model scored on the rollout canvases, for algorithms
            with `needs_rollout_reference`.
    """

    def __init__(self, model: Any, sampling: SamplingConfig, *, algorithm: RLAlgorithm[Any] | None = None,
                 ref_model: Any = None) -> None:
        self.model = model
        self.sampling = sampling_for(model, sampling, algorithm)
        self.algorithm = algorithm
        self.ref_model = ref_model
        self.last_metrics: dict[str, float] = {}
        check_rollout_record(algorithm, self.sampling)
        if algorithm is not None and algorithm.needs_rollout_reference and ref_model is None:
            raise ValueError(f"algorithm {algorithm.label} scores rollouts with a reference model; "
                             "pass RolloutWorker(..., ref_model=<frozen copy of the initial policy>)")

    def generate(self, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> RolloutBatch:
        """Decode `prompts` with one seed per sample (the seeds make every sample replayable)."""
        from dllm_rollout.batch import concat_batches
        from dllm_rollout.graphs import capture_failures

        failures = capture_failures()
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        traits = self.model.traits
        step = self.sampling.max_rows or len(prompts)
        if self.algorithm is not None and step < len(prompts) and not self.algorithm.chunkable_rollout:
            step = len(prompts)
        parts = []
        # adapters folded into the weights for the decode (exactly restored after), unless the
        # rollout also reads the same base weights as its frozen reference
        merged = merged_adapters(self.model) if not isinstance(self.ref_model, BaseWeightsView) else nullcontext()
        with torch.no_grad(), merged:
            for a in range(0, len(prompts), step):
                ids, mask = left_pad(prompts[a:a + step], traits.pad_token_id, device)
                s = seeds[a:a + step]
                if self.algorithm is not None:
                    parts.append(self.algorithm.generate(self.model, ids, mask, s, self.sampling, self.ref_model))
                else:
                    from dllm_rollout import decode

                    parts.append(decode(self.model, ids, mask, s, self.sampling, self.ref_model))
        self.model.train(was_training)
        # a CUDA-graph capture that failed ran its step eagerly (slower, same samples): counted, not silent
        self.last_metrics = {"graph_capture_failures": float(capture_failures() - failures)}
        if len(parts) == 1:
            return parts[0]
        return concat_batches(parts, pad_id=int(traits.pad_token_id), mask_id=int(traits.mask_token_id))

    def consistency(self, rollout: RolloutBatch) -> dict[str, float]:
        """The no-cache replay of the rollout's trajectory (`dllm_rollout.consistency_gap`): the gaps
        between the rollout's per-step log-probs and the trainer's recomputation of them."""
        from dllm_rollout import consistency_gap

        return {k: float(v) for k, v in consistency_gap(self.model, rollout).items()}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Weight hand-off from the actor (`load_rollout_weights`)."""
        load_rollout_weights(self.model, state)


def load_rollout_weights(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Weight hand-off from the actor into a rollout model: a full state dict, or only LoRA adapters.

    Keys missing from `state` keep their values, so an adapter-only dict
    (`dllm_models.adapter_state_dict`) updates just the adapters.
    """
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        raise ValueError(f"load_weights got {len(unknown)} keys the rollout model lacks, e.g. {unknown[:3]}")
    model.load_state_dict(state, strict=False)


class Rollout(Protocol):
    """What a rank's rollout worker offers: `RolloutWorker` (native decoding) and
    `dllm_train.engine_rollout.EngineRolloutWorker` (an inference engine)."""

    model: Any
    sampling: SamplingConfig
    last_metrics: dict[str, float]

    def generate(self, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> RolloutBatch: ...

    def consistency(self, rollout: RolloutBatch) -> dict[str, float]:
        """How closely the trainer's model reproduces this worker's rollout (`trainer.consistency_every`)."""
        ...

    def load_weights(self, state: dict[str, torch.Tensor]) -> None: ...


class RewardWorker:
    """Scores decoded responses with a verifiable reward.

    When the rollout recorded per-step clean predictions (`step_x0`), their rewards become
    `RLBatch.step_scores` [B, S] (NaN past a row's last step).
    """

    def __init__(self, reward_fn: Callable[[str, str], float], detokenize: Callable[[list[int]], str]) -> None:
        self.reward_fn = reward_fn
        self.detokenize = detokenize

    def _text(self, ids: list[int], keep: list[bool]) -> str:
        return self.detokenize([t for t, k in zip(ids, keep) if k])

    def score(self, rollout: RolloutBatch, answers: Sequence[str], groups: torch.Tensor,
              tokens: SpecialTokens) -> RLBatch:
        """The rollout with its rewards [B], decoded texts and (with step records) step scores."""
        if len(answers) != rollout.batch_size:
            raise ValueError(f"got {len(answers)} answers for a rollout of {rollout.batch_size} samples")
        texts = [self._text(ids, keep) for ids, keep in
                 zip(rollout.response_ids.tolist(), rollout.response_mask.tolist())]
        scores = torch.tensor([self.reward_fn(t, a) for t, a in zip(texts, answers)], dtype=torch.float32)
        steps = self._step_scores(rollout, answers) if rollout.step_x0 is not None else None
        return RLBatch(rollout=rollout, scores=scores, group_ids=groups, tokens=tokens, step_scores=steps,
                       texts=texts)

    def _step_scores(self, rollout: RolloutBatch, answers: Sequence[str]) -> torch.Tensor:
        assert rollout.step_x0 is not None and rollout.step_canvas is not None
        b, s, _ = rollout.step_x0.shape
        out = torch.full((b, s), float("nan"))
        for i in range(b):
            keep = rollout.response_mask[i].tolist()
            for k in range(s):
                # a step past the row's last one is padded with the all-mask canvas of step 0
                if k > 0 and bool((rollout.step_canvas[i, k] == rollout.step_canvas[i, 0]).all()):
                    continue
                out[i, k] = self.reward_fn(self._text(rollout.step_x0[i, k].tolist(), keep), answers[i])
        return out


def value_passes(algorithm: RLAlgorithm[Any]) -> int:
    """Old or reference passes per rollout batch: one per iteration, or one for all of them when
    the algorithm's values ignore the iteration (`RLAlgorithm.values_vary_by_iteration`)."""
    return algorithm.num_iterations if algorithm.values_vary_by_iteration else 1


class ReferenceWorker:
    """A frozen copy of the initial policy, for KL terms and reference likelihoods.

    Args:
        model: the frozen model.
        scorer: how it is run (default `Scorer(model)`; e.g. a `SequenceParallelScorer`).
        max_tokens_per_pass: token budget of one forward (0: one forward per scorer call).
        freeze: put `model` in eval mode with every parameter frozen (False when `model` is the
            trained policy itself, scored as its base weights by a `BaseWeightsScorer`).
    """

    def __init__(self, model: Any, *, scorer: Scorer | None = None, max_tokens_per_pass: int = 0,
                 freeze: bool = True) -> None:
        self.model = model
        if freeze:
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
        self.scorer = scorer if scorer is not None else Scorer(self.model)
        self.max_tokens = token_budget(max_tokens_per_pass)

    def values(self, algorithm: RLAlgorithm[D], prepared: Prepared[D]) -> list[torch.Tensor]:
        """The algorithm's values under the reference model, one entry per update iteration."""
        out = []
        for i in range(value_passes(algorithm)):
            def fn(s: ValuesScorer, i: int = i) -> torch.Tensor:
                return algorithm.values(s, prepared.batch, prepared.data, i)
            out.append(evaluate(fn, self.scorer, self.max_tokens)[0])
        return out * (algorithm.num_iterations // len(out))


class ActorWorker(Generic[D]):
    """Holds the trainable policy and its optimizer; computes old values and updates.

    Args:
        model: the trainable policy.
        algorithm: the RL algorithm.
        optim: optimizer settings.
        scorer: how the policy is run for every old and training pass (default `Scorer(model)`;
            a `SequenceParallelScorer` splits each sequence over a group of ranks).
        max_tokens_per_pass: token budget of one forward of every old and training pass (0: one
            forward per scorer call); the gradients equal the single-batch ones.
        reuse_old: skip the separate old pass when it is provably redundant: a row-local loss
            with one update per batch reads its old values from the same weights, inputs and
            masks as its training forward, so the training forward's values (detached) are the
            old values (ratio exactly 1). Saves one forward over the batch per step.
        optimizer_offload: `offload_optimizer` moves the optimizer state to host memory until the
            next optimizer step (`trainer.optimizer_offload`; `PolicyRank.rollout_step` calls it
            before the rollout); `update` then reports `optimizer_restore_s`.
    """

    def __init__(self, model: Any, algorithm: RLAlgorithm[D], optim: OptimConfig, *,
                 scorer: Scorer | None = None, max_tokens_per_pass: int = 0, reuse_old: bool = True,
                 optimizer_offload: bool = False) -> None:
        if optim.schedule != "constant" and not optim.decay_steps:
            raise ValueError(f"optim.schedule={optim.schedule!r} in RL needs optim.decay_steps (e.g. trainer.max_steps): "
                             "the actor does not know the run's length")
        self.model = model
        self.algorithm = algorithm
        self.scorer = scorer if scorer is not None else Scorer(model)
        # ranks in lockstep skip together: the gradient clipping is a collective on them
        self.optim = OptimizerStep(model, optim, group=self.scorer.lockstep_group)
        self.optimizer = self.optim.optimizer
        self.max_tokens = token_budget(max_tokens_per_pass)
        self.reuse_old = reuse_old
        self.optimizer_offload = optimizer_offload

    @property
    def optim_cfg(self) -> OptimConfig:
        """The optimizer settings (those of `optim`, the one copy the schedule reads)."""
        return self.optim.cfg

    @property
    def updates(self) -> int:
        """Optimizer updates made (the schedule's counter)."""
        return self.optim.updates

    @property
    def skipped(self) -> int:
        """Optimizer steps skipped for a non-finite loss or gradient norm."""
        return self.optim.skipped

    @property
    def old_from_training_pass(self) -> bool:
        """Whether old values come from the training forward (see `reuse_old`)."""
        alg = self.algorithm
        return (self.reuse_old and alg.needs_old and alg.num_iterations == 1 and alg.row_local
                and alg.mini_batch_rows == "all")

    def _values_fn(self, prepared: Prepared[D], iteration: int) -> ValuesFn:
        alg = self.algorithm

        def fn(scorer: ValuesScorer) -> torch.Tensor:
            return alg.values(scorer, prepared.batch, prepared.data, iteration)
        return fn

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> Prepared[D]:
        """The algorithm's per-batch data and the old values (unless the training pass gives them)."""
        alg = self.algorithm
        prepared: Prepared[D] = Prepared(batch=batch, data=alg.prepare(batch, generator))
        if not alg.needs_old or self.old_from_training_pass:
            return prepared
        was_training = self.model.training
        self.model.eval()
        old, outputs = [], None
        for i in range(value_passes(alg)):
            values, raw = evaluate(self._values_fn(prepared, i), self.scorer, self.max_tokens)
            old.append(values)
            if i == 0:
                outputs = raw
        self.model.train(was_training)
        return dataclasses.replace(prepared, old=old * (alg.num_iterations // len(old)), old_outputs=outputs)

    def update(self, prepared: Prepared[D], advantages: torch.Tensor,
               critic: CriticTargets | None = None) -> dict[str, float]:
        """Per algorithm iteration, one optimizer step per mini-batch (`RLAlgorithm.mini_batch_rows`);
        a non-finite loss or gradient skips it. `critic`: what the algorithm derived from its value
        model's old values (`LossInputs.critic`; None without a value model).

        Returns:
            the last iteration's metrics, averaged over its mini-batches, with `optimizer_steps`
            (the optimizer updates made) and `skipped` (the steps skipped) counted over all of them.
        """
        out: dict[str, float] = {}
        updates, skipped, restore_s = self.optim.updates, self.optim.skipped, self.optim.restore_s
        for i in range(self.algorithm.num_iterations):
            parts = [self._step(part, advantages, i, critic) for part in mini_batches(self.algorithm, prepared)]
            out = mean_metrics(parts)
        out.update(optimizer_steps=float(self.optim.updates - updates), skipped=float(self.optim.skipped - skipped))
        if self.optimizer_offload:
            out["optimizer_restore_s"] = self.optim.restore_s - restore_s
        return out

    def _step(self, prepared: Prepared[D], advantages: torch.Tensor, iteration: int,
              critic: CriticTargets | None = None) -> dict[str, float]:
        alg = self.algorithm
        self.model.train()
        self.optim.zero_grad()
        old = prepared.old[iteration] if prepared.old is not None else None
        ref = prepared.ref[iteration] if prepared.ref is not None else None

        def loss_fn(values: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            previous = old if old is not None else (values.detach() if alg.needs_old else None)
            return alg.loss(values, LossInputs(batch=prepared.batch, data=prepared.data, iteration=iteration,
                                               advantages=advantages, old=previous, ref=ref, critic=critic))

        reuse = prepared.old_outputs if iteration == 0 and not alg.row_local else None
        result = accumulate(self._values_fn(prepared, iteration), loss_fn, self.scorer, max_tokens=self.max_tokens,
                            row_local=alg.row_local, outputs=reuse)
        out = {k: float(v) for k, v in result.metrics.items()}
        out["loss"] = float(result.loss)
        out["update_passes"] = float(result.forwards)
        stepped = self.optim.step(out["loss"])
        out.update({k: v for k, v in stepped.items() if k != "lr"})
        return out

    def release_gradients(self) -> None:
        """Free the parameters' gradients (spent by the last update; the next one recomputes them)."""
        self.optim.zero_grad()

    def offload_optimizer(self) -> bool:
        """Move the optimizer state to host memory until the next optimizer step needs it
        (`OptimizerStep.offload`); whether it did (False unless `optimizer_offload`)."""
        if self.optimizer_offload:
            self.optim.offload()
        return self.optimizer_offload

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Trainable weights only (LoRA adapters after `apply_lora`), for the rollout hand-off."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach() for k, v in self.model.state_dict().items() if k in names}

    def state(self) -> dict[str, Any]:
        return {**self.optim.state(), "optim_cfg": asdict(self.optim_cfg)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optim.load_state(state)

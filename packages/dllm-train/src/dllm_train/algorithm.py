"""What the trainer needs from an RL algorithm: a typed interface, and the typed data it reads.

An algorithm is a small object (`RLAlgorithm`, an `dllm_train.objective.Objective` over rollout
batches: see there what RL shares with SFT and preference) with typed methods; the workers call
them and never look at its name. Everything it needs from a step arrives in named fields (`RLBatch`,
`LossInputs`); everything it derives per batch lives in its own typed data object (`D`, returned
by `prepare` and handed back to `values` and `loss`). No string keys travel between the two.

One step, for every backend (`dllm_train.step`):

1. `sampling` / `generate`: the rollout (with the record fields it declares, `record_fields`);
2. the reward worker fills `RLBatch` (scores, per-step scores when steps were recorded);
3. `prepare(batch, generator) -> data`: the noise shared by the old, reference and current
   passes (one entry per update iteration), training rows, step or tree advantages, weights;
4. `values(scorer, batch, data, iteration)`: the values the loss compares, from scorer calls
   only (old and reference values are the same function under other weights); the trainer
   splits its scorer calls into token-budget passes (`dllm_train.passes`);
5. `advantages(scores, group_ids)` on the whole batch (groups may straddle ranks);
6. `loss(values, inputs) -> (loss, metrics)`, once per optimizer step: each iteration's training
   rows form one mini-batch, or several (`mini_batch_rows`), each its own optimizer step.

An algorithm with a value model (`critic` is a `CriticSpec`) adds, on the same rows
(`dllm_train.critic.ValueWorker` runs them): `critic_values(scorer, batch, data)` under the value
model after `prepare` (the old values), `critic_targets(batch, data, old, advantages)` after the
advantages (its per-token advantages reach `loss` as `LossInputs.critic`), and
`critic_loss(values, inputs)` for the value model's own optimizer step.

Concrete algorithms live in `dllm_algorithms`; the app keeps the registry of names.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch

from dllm_objectives import grpo_advantages
from dllm_rollout import RolloutBatch, SamplingConfig, decode, record_settings
from dllm_rollout.record_schema import REPLAY, check_field_names
from dllm_train.objective import Metrics, Objective
from dllm_train.passes import ValuesScorer

D = TypeVar("D")
MiniBatchRows = Literal["all", "rollout", "prompts"]
"""The rows of one optimizer step (`RLAlgorithm.mini_batch_rows`)."""


@dataclass(frozen=True)
class SpecialTokens:
    """The policy's special token ids (read from the model, never hard-coded)."""

    mask_id: int
    eos_id: int
    pad_id: int


@dataclass(frozen=True)
class RLBatch:
    """A rollout batch with its rewards: what an algorithm prepares from.

    Attributes:
        rollout: prompts, responses, masks (and trajectory records when requested).
        scores: [B] rewards.
        group_ids: [B] prompt index of each sample.
        tokens: the policy's special ids.
        step_scores: [B, S] reward of each recorded step's clean prediction (NaN past a row's
            last step), present when the rollout recorded steps.
        texts: decoded responses, for logging.
    """

    rollout: RolloutBatch
    scores: torch.Tensor
    group_ids: torch.Tensor
    tokens: SpecialTokens
    step_scores: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Prepared(Generic[D]):
    """A batch ready for the update: the algorithm's data, old and reference values.

    Attributes:
        batch: the rollout and rewards.
        data: what `RLAlgorithm.prepare` derived.
        old: per update iteration, the values under the rollout policy (None: not needed, or
            taken from the training pass on-policy).
        old_outputs: the raw scorer outputs of iteration 0's old pass, reused by the update of
            a non-row-local loss as its value pass (the weights have not moved since).
        ref: per update iteration, the values under the reference model.
    """

    batch: RLBatch
    data: D
    old: list[torch.Tensor] | None = None
    old_outputs: list[torch.Tensor] | None = None
    ref: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class CriticSpec:
    """What an algorithm asks of its value model (`RLAlgorithm.critic`).

    Attributes:
        lr: the value model's AdamW learning rate (its other settings are the actor's).
        every: train the value model at steps ``s`` with ``s % every == 0`` (1-based; its values
            and targets are computed at every step).
        row_local: the value loss's gradient with respect to each scored row depends on that row alone.
    """

    lr: float
    every: int = 1
    row_local: bool = True

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"the value model's learning rate must be > 0, got {self.lr}")
        if self.every < 1:
            raise ValueError(f"the value model's training period must be >= 1 step, got {self.every}")


@dataclass(frozen=True)
class CriticTargets:
    """What an algorithm derives from its value model's old values (`RLAlgorithm.critic_targets`).

    Attributes:
        advantages: the advantages the policy loss reads (shaped like the algorithm's values).
        returns: the value model's regression targets (shaped like its values).
    """

    advantages: torch.Tensor
    returns: torch.Tensor


@dataclass(frozen=True)
class CriticInputs(Generic[D]):
    """Everything `RLAlgorithm.critic_loss` reads besides the value model's current values.

    Attributes:
        batch: the step's batch.
        data: what `prepare` derived.
        old: the value model's values before its update (`critic_values`, without grad).
        targets: what `critic_targets` derived from them.
    """

    batch: RLBatch
    data: D
    old: torch.Tensor
    targets: CriticTargets


@dataclass(frozen=True)
class LossInputs(Generic[D]):
    """Everything `RLAlgorithm.loss` reads besides the current values.

    Attributes:
        batch: the step's batch.
        data: what `prepare` derived.
        iteration: the update iteration (0 .. num_iterations - 1).
        advantages: [B] outcome advantages (from `RLAlgorithm.advantages` on the whole batch).
        old: the values under the policy that generated the batch (the detached current values
            when the old pass was skipped on-policy); None if the algorithm needs none.
        ref: the values under the reference model, when the algorithm has one.
        critic: with a value model (`RLAlgorithm.critic`), what `critic_targets` derived from
            its old values (per-token advantages...); None without.
    """

    batch: RLBatch
    data: D
    iteration: int
    advantages: torch.Tensor
    old: torch.Tensor | None
    ref: torch.Tensor | None
    critic: CriticTargets | None = None


class RLAlgorithm(Objective[RLBatch, D]):
    """An RL algorithm: typed methods the trainer calls (see the module doc for the order).

    Flags: class constants (`row_local = True` in a subclass, never a dataclass field, so no config
    or command line changes them; `Objective` refuses a subclass that annotates one) or
    properties; `num_iterations` alone is a hyper-parameter (a field where an algorithm has it):
        needs_old: the loss compares with values under the rollout policy (a ratio).
        needs_reference: a frozen reference model scores `values` too (a KL term).
        record_fields: the rollout record fields (`dllm_rollout.RECORD_FIELDS`) the algorithm reads
            beyond prompts and responses, e.g. `frozenset({"unmask_step"})`: `sampling` asks the
            decoder for them, and a run whose rollout backend does not fill one is refused before
            any model loads (`dllm_train.check_rollout_record`).
        needs_rollout_reference (a property): the rollout scores its canvases with the reference
            model: `"ref_step_logp"` is in `record_fields`.
        num_iterations: update iterations per rollout batch (each on its own `prepare` entry;
            one optimizer step each, or one per mini-batch).
        values_vary_by_iteration: `values` may differ between iterations (each reads its own
            noise); False (its values ignore `iteration`): the old and reference passes run once
            and serve every iteration.
        row_local: the loss's gradient with respect to each scorer row depends on that row
            alone, so token-budget passes need no separate value pass (`dllm_train.passes`).
        replays_trajectory (a property): the algorithm reads the rollout's trajectory records
            (`record_fields` meets `dllm_rollout.record_schema.REPLAY`), which token editing cannot
            reproduce.
        chunkable_rollout: `generate` may run on any subset of rows (`rollout.max_rows`); False
            for rollouts that couple rows (e.g. a tree over a whole group).
        mini_batch_rows: the rows of one optimizer step: "all" (every training row of an
            iteration, one step), "rollout" (contiguous mini-batches of as many rows as the
            rank's rollout batch, one optimizer step each, like verl's `ppo_mini_batch_size` equal
            to the rollout batch: training rows packed as K copies of the batch, copy-major, give
            K steps per iteration) or "prompts" (contiguous mini-batches of as many rows as the
            rank has prompts, i.e. distinct `group_ids`: verl's `ppo_mini_batch_size` equal to the
            prompts per step with `rollout.n = 1`, over rows the algorithm lays out in step order).
            Old values are computed once, before the first step, so the later mini-batches are
            off-policy. "rollout" and "prompts" need `num_rows` and `select_rows`.
        needs_distinct_samples (a property): the reward reaches the gradient only through differences
            between the samples of a group (group-relative advantages or weights): when every
            sample of a group is the same, as under deterministic decoding
            (`SamplingConfig.deterministic`, e.g. temperature 0), the policy gradient is
            identically zero. True for the default GRPO advantages; a run config refuses such
            decoding for an algorithm that declares it.
        critic (a property): the algorithm's value model (`CriticSpec`), or None (the default):
            then `critic_values`, `critic_targets` and `critic_loss` define its maths.
    """

    needs_old: ClassVar[bool] = True
    record_fields: ClassVar[frozenset[str]] = frozenset()
    chunkable_rollout: ClassVar[bool] = True
    values_vary_by_iteration: ClassVar[bool] = True
    num_iterations: int = 1
    constants = (*Objective.constants, "needs_old", "record_fields", "needs_rollout_reference", "replays_trajectory",
                 "chunkable_rollout", "values_vary_by_iteration", "mini_batch_rows", "needs_distinct_samples", "critic")

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        fields = check_field_names(cls.record_fields, owner=f"{cls.__name__}.record_fields")
        legacy = vars(cls).get("needs_rollout_reference")
        if isinstance(legacy, bool):  # the flag of before `record_fields`: it declares the reference's field
            fields = fields | {"ref_step_logp"} if legacy else fields - {"ref_step_logp"}
            delattr(cls, "needs_rollout_reference")
        cls.record_fields = fields

    @property
    def needs_rollout_reference(self) -> bool:
        """Whether the rollout scores its canvases with the reference model (`ref_step_logp` is in
        `record_fields`)."""
        return "ref_step_logp" in self.record_fields

    @property
    def replays_trajectory(self) -> bool:
        """Whether the algorithm reads the rollout's trajectory records, which token editing cannot
        reproduce (`record_fields` meets `dllm_rollout.record_schema.REPLAY`)."""
        return bool(self.record_fields & REPLAY)

    @property
    def mini_batch_rows(self) -> MiniBatchRows:
        """The rows of one optimizer step (default "all": one step per iteration)."""
        return "all"

    def num_rows(self, data: D) -> int:
        """Training rows in `data` (the first dimension of `values`), for `mini_batch_rows="rollout"`."""
        raise NotImplementedError(f"{self.label} splits no training rows into mini-batches")

    def select_rows(self, data: D, rows: slice) -> D:
        """`data` restricted to training rows `rows` (what `values` and `loss` read for a mini-batch)."""
        raise NotImplementedError(f"{self.label} splits no training rows into mini-batches")

    @property
    def needs_distinct_samples(self) -> bool:
        """Whether the policy gradient is identically zero when every sample of a group is the
        same (default: yes, as for the default GRPO advantages); see the class doc."""
        return True

    def zero_gradient_under(self, sampling: SamplingConfig) -> bool:
        """Whether the policy gradient is identically zero under the run's decoding `sampling`:
        this algorithm's rollout (`sampling(...)`) draws no randomness, so every sample of a group
        is the same response, and the algorithm learns only from their differences."""
        return self.needs_distinct_samples and self.sampling(sampling).deterministic

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """The run's SamplingConfig with what this algorithm's rollout must record (default: the
        switches that make the native decoders fill `record_fields`, `dllm_rollout.record_settings`)."""
        return record_settings(sampling, self.record_fields)

    def generate(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
                 sampling: SamplingConfig, ref_model: Any) -> RolloutBatch:
        """The rollout (default: the standard decoder of `dllm_rollout.decode`)."""
        return decode(model, prompt_ids, prompt_mask, seeds, sampling, ref_model)

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """[B] outcome advantages (default: GRPO, reward minus group mean over group std)."""
        return grpo_advantages(scores, group_ids)

    @abstractmethod
    def prepare(self, batch: RLBatch, generator: torch.Generator) -> D:
        """Per-batch data: the shared noise of every iteration and derived tensors."""

    @abstractmethod
    def values(self, scorer: ValuesScorer, batch: RLBatch, data: D, iteration: int) -> torch.Tensor:
        """The values the loss compares, from calls of `scorer` (a `dllm_train.Scorer` or a stand-in:
        only what `ValuesScorer` declares).

        Pure given its inputs: the trainer calls it several times and splits its scorer calls
        into passes.
        """

    @abstractmethod
    def loss(self, values: torch.Tensor, inputs: LossInputs[D]) -> tuple[torch.Tensor, Metrics]:
        """(scalar loss, detached scalar metrics) of the current values."""

    @property
    def critic(self) -> CriticSpec | None:
        """The value model this algorithm trains beside the policy (None: none, the default)."""
        return None

    def critic_values(self, scorer: ValuesScorer, batch: RLBatch, data: D) -> torch.Tensor:
        """The value model's values on the algorithm's rows, from calls of `scorer` (a
        `dllm_train.critic.ValueScorer`: each call returns per-position values); pure like `values`."""
        raise NotImplementedError(f"{self.label} has no value model")

    def critic_targets(self, batch: RLBatch, data: D, old: torch.Tensor, advantages: torch.Tensor) -> CriticTargets:
        """The policy's advantages and the value model's returns from its old values `old` and the
        batch's outcome advantages [B] (`advantages`)."""
        raise NotImplementedError(f"{self.label} has no value model")

    def critic_loss(self, values: torch.Tensor, inputs: CriticInputs[D]) -> tuple[torch.Tensor, Metrics]:
        """(scalar value-model loss, detached scalar metrics) of the value model's current values."""
        raise NotImplementedError(f"{self.label} has no value model")


def with_fields(sampling: SamplingConfig, **changes: Any) -> SamplingConfig:
    """`sampling` with `changes` applied (a helper for `RLAlgorithm.sampling` overrides)."""
    return dataclasses.replace(sampling, **changes)


def mini_batch_slices(algorithm: RLAlgorithm[D], batch: RLBatch, data: D) -> list[slice]:
    """The training rows of each optimizer step of one iteration (`RLAlgorithm.mini_batch_rows`).

    Returns:
        "all": `[slice(None)]`; "rollout": contiguous slices of `batch.rollout.batch_size` rows;
        "prompts": contiguous slices of as many rows as `batch.group_ids` has distinct prompts
        (the last slice shorter when the rows are not a multiple of the size).
    """
    if algorithm.mini_batch_rows == "all":
        return [slice(None)]
    total = algorithm.num_rows(data)
    if algorithm.mini_batch_rows == "prompts":
        size = int(torch.unique(batch.group_ids).numel())
    else:
        size = batch.rollout.batch_size
    return [slice(a, min(a + size, total)) for a in range(0, total, size)]


__all__ = ["CriticInputs", "CriticSpec", "CriticTargets", "LossInputs", "Metrics", "MiniBatchRows", "Prepared", "RLAlgorithm", "mini_batch_slices", "RLBatch", "SpecialTokens", "with_fields"]

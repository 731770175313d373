"""What the trainer needs from an algorithm of any kind (RL, SFT, preference), and what differs.

An algorithm is a typed object that owns its noise and its loss; a worker runs its scorer calls in
token-budget passes (`dllm_train.passes`) and takes the optimizer step (`dllm_train.optim`), and
never looks at its name. What every kind shares, `Objective[B, D]` (B: the batch it trains on, D:
what it derives from one):

- `prepare(batch, generator) -> data`: the noise (mask plans) that every pass over the batch
  reuses, and whatever else it derives from the batch;
- `values(scorer, batch, data, ...)`: the values its loss compares, from calls of a
  `ValuesScorer` only, pure given its inputs (the passes call it several times);
- `loss(values, inputs) -> (scalar loss, detached scalar metrics)`, with `inputs` the typed
  record of everything else the loss reads;
- class constants (`ClassVar`): `row_local` (the loss's gradient with respect to each scored row
  depends on that row alone, so the passes need no separate value pass), `families`, and the
  property `needs_reference` (a frozen reference model scores values too). They say what the
  algorithm's math is, so they are never dataclass fields: no config or command line can change
  them (a subclass that annotates one fails at its definition, and under mypy).

What differs, and why it does:

- RL (`dllm_train.algorithm.RLAlgorithm`): the batch is a scored rollout (`RLBatch`) and one
  batch gives `num_iterations` optimizer steps, each on its own noise, so `values` takes the
  `iteration`; `loss` reads `LossInputs` (advantages on the whole batch, old and reference
  values); an RL algorithm also chooses its rollout (`sampling`, `generate`), its advantages and
  its mini-batches.
- SFT and preference (`OfflineObjective`): a fixed batch per step and one optimizer step per
  batch, so `values(scorer, batch, data)`; the reference may score noise of its own
  (`reference_values`; preference methods with independent masks); `loss` reads `OfflineInputs`
  (batch, data and reference values). `dllm_train.offline.OfflineWorker` trains any of them, so a
  new SFT or preference method is a class in `dllm_algorithms` (or anywhere), not a trainer change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from dllm_train.passes import ValuesScorer

Metrics = dict[str, torch.Tensor]
B = TypeVar("B")
D = TypeVar("D")


class Objective(ABC, Generic[B, D]):
    """The part of an algorithm that every kind shares (see the module doc).

    Class constants (override as `name = value` in a subclass, or as a property):
        row_local: the loss's gradient with respect to each scorer row depends on that row alone.
        families: canonical family names the algorithm is defined for (`dllm_models`' registry).
        needs_reference (a property): a frozen reference model scores values too.
    """

    row_local: ClassVar[bool] = False
    families: ClassVar[tuple[str, ...]] = ()
    constants: ClassVar[tuple[str, ...]] = ("row_local", "families", "needs_reference", "constants")
    """The names a subclass may set only as class constants (or properties), never as fields."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__", {})
        names = {n for k in cls.__mro__ for n in vars(k).get("constants", ())}
        for name in sorted(names & set(own)):
            if "ClassVar" not in str(own[name]):
                raise TypeError(
                    f"{cls.__name__}.{name} is annotated as a field, but {name} is a constant of the algorithm's "
                    f"math, not a hyper-parameter: write `{name} = ...` (a ClassVar) or a property, so that no "
                    "config or command line can change it")

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model scores values too (default: no)."""
        return False

    @property
    def label(self) -> str:
        """A name for logs and errors (the class name)."""
        return type(self).__name__

    @abstractmethod
    def prepare(self, batch: B, generator: torch.Generator) -> D:
        """What every pass over `batch` reuses: its noise (drawn from `generator`) and derived tensors."""


@dataclass(frozen=True)
class OfflineInputs(Generic[B, D]):
    """Everything `OfflineObjective.loss` reads besides the current values.

    Attributes:
        batch: the step's batch.
        data: what `prepare` derived.
        ref: the reference values (`reference_values` under the reference model), when
            `needs_reference`; None otherwise.
    """

    batch: B
    data: D
    ref: torch.Tensor | None


class OfflineObjective(Objective[B, D]):
    """An SFT or preference algorithm: one optimizer step per fixed batch (`OfflineWorker`).

    Class constants:
        noise_stream: the purpose of the step's generator, `generator(seed, noise_stream, step)`.
    """

    noise_stream: ClassVar[str] = "offline-mask"
    constants = (*Objective.constants, "noise_stream")

    @abstractmethod
    def values(self, scorer: ValuesScorer, batch: B, data: D) -> torch.Tensor:
        """The policy's values the loss compares, from calls of `scorer` only (pure given its inputs)."""

    def reference_values(self, scorer: ValuesScorer, batch: B, data: D) -> torch.Tensor:
        """The values under the reference model (default: `values`, on the same noise)."""
        return self.values(scorer, batch, data)

    @abstractmethod
    def loss(self, values: torch.Tensor, inputs: OfflineInputs[B, D]) -> tuple[torch.Tensor, Metrics]:
        """(scalar loss, detached scalar metrics) of the current values."""


__all__ = ["Metrics", "Objective", "OfflineInputs", "OfflineObjective"]

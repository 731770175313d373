"""The rollout record in a run: the one rule that refuses a backend lacking a field the run needs,
and the opt-in store of each step's record in the run folder (`trainer.save_rollouts_every`).

The rule (`check_rollout_record`) compares the record fields the algorithm declares
(`RLAlgorithm.record_fields`) and those the run's own switches ask for (`rollout.record_trajectory`,
`rollout.record_steps`) with what the rollout backend fills (`dllm_rollout.record_fields_filled`),
before any model loads. Stored records live in `<run>/rollouts/step_XXXXXX.rankR.safetensors`
(`dllm_rollout.save_rollout`'s format), written atomically; `read_rollouts` reads them back. No
resume reads them: every algorithm's step starts from a fresh rollout, so a checkpoint holds no
rollout (docs/generation.md#rollout-storage).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dllm_rollout import (
    RolloutBatch,
    SamplingConfig,
    backend_of,
    load_rollout,
    record_fields_filled,
    requested_fields,
    rollout_bytes,
)
from dllm_rollout.record_schema import STEPS
from dllm_train.algorithm import RLAlgorithm
from dllm_train.folder_files import replace_text

ROLLOUTS = "rollouts"
"""The run folder's subfolder of stored rollout records."""
_NAME = re.compile(r"^step_(\d{6,})\.rank(\d+)\.safetensors$")


def _backend_words(sampling: SamplingConfig) -> tuple[str, str]:
    """(who decodes, the fix) for a refusal message."""
    if sampling.engine != "native":
        return f"rollout.engine={sampling.engine}", "use rollout.engine=native"
    kind = "block" if sampling.block_diffusion else "masked"
    return f"the native {kind}-diffusion decoder", "use a model whose decoder fills it"


def check_rollout_record(algorithm: RLAlgorithm[Any] | None, sampling: SamplingConfig) -> None:
    """Raise, in one line naming who asks, the field and the backend, when the run's rollout
    backend does not fill a record field the run needs.

    Args:
        algorithm: the run's algorithm (None: only the switches of `sampling` ask); one that runs
            its own rollout (overrides `generate`) fills its own record and runs on the native
            backend only.
        sampling: the run's effective decoding settings (`dllm_train.sampling_for`).

    Raises:
        ValueError: e.g. "algorithm X needs rollout record field 'step_canvas', which
            rollout.engine=lmdeploy does not fill; use rollout.engine=native".
    """
    if algorithm is not None and type(algorithm).generate is not RLAlgorithm.generate:
        if sampling.engine != "native":
            raise ValueError(f"algorithm {algorithm.label} runs its own rollout (not the standard decoder), "
                             f"which rollout.engine={sampling.engine} cannot run: set rollout.engine=native")
        return
    reference = algorithm is not None and algorithm.needs_rollout_reference
    filled = record_fields_filled(sampling, backend=backend_of(sampling), reference=reference)
    who, fix = _backend_words(sampling)
    needed = sorted(algorithm.record_fields - filled) if algorithm is not None else []
    if algorithm is not None and needed:
        raise ValueError(f"algorithm {algorithm.label} needs rollout record field {needed[0]!r}, which {who} "
                         f"does not fill; {fix}")
    asked = sorted(requested_fields(sampling) - filled)
    if asked:
        switch = "rollout.record_steps" if asked[0] in STEPS else "rollout.record_trajectory"
        raise ValueError(f"{switch}=true asks for rollout record field {asked[0]!r}, which {who} does not fill; "
                         f"{fix} or set {switch}=false")


def check_rollout_filled(algorithm: RLAlgorithm[Any], rollout: RolloutBatch) -> None:
    """Raise if a rollout lacks a record field the algorithm declared (a backend that claimed it
    and did not fill it: `check_rollout_record` passed on its claim)."""
    missing = sorted(algorithm.record_fields - rollout.filled_fields())
    if missing:
        raise RuntimeError(f"the rollout lacks record fields {missing} that algorithm {algorithm.label} declares "
                           "(record_fields), though its backend claims them (dllm_rollout.record_fields_filled)")


def rollout_path(run_dir: str | Path, step: int, rank: int = 0) -> Path:
    """`<run_dir>/rollouts/step_XXXXXX.rankR.safetensors`: the record of (1-based) `step` on `rank`."""
    return Path(run_dir) / ROLLOUTS / f"step_{step:06d}.rank{rank}.safetensors"


class RolloutSaver:
    """Writes every `every`-th step's rollout record into the run folder (`trainer.save_rollouts_every`).

    Args:
        run_dir: the run folder; records go to `rollout_path(run_dir, step + 1, rank)`.
        every: the period in steps (the steps whose 1-based number it divides).
        rank: this rank's index (each rank writes its own rows).
    """

    def __init__(self, run_dir: str | Path, every: int, *, rank: int = 0) -> None:
        if every < 1:
            raise ValueError(f"trainer.save_rollouts_every must be >= 1 for a RolloutSaver, got {every}")
        self.run_dir, self.every, self.rank = Path(run_dir), every, rank

    def __call__(self, step: int, rollout: RolloutBatch) -> None:
        """Store `rollout` of (0-based) `step` if the period says so; a resumed run replaces a step's
        file atomically (`folder_files.replace_text`)."""
        if (step + 1) % self.every:
            return
        path = rollout_path(self.run_dir, step + 1, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, rollout_bytes(rollout))


def read_rollouts(run_dir: str | Path, *, steps: Collection[int] | None = None) -> dict[int, list[RolloutBatch]]:
    """The rollout records stored in a run folder (`trainer.save_rollouts_every`), for analysis.

    Args:
        run_dir: the run folder.
        steps: the (1-based) steps to read (None: all).

    Returns:
        step -> that step's records, one per rank in rank order (empty when none were stored).

    Raises:
        ValueError: a record of a newer version than this dllm_rollout reads (`dllm_rollout.load_rollout`).
    """
    folder = Path(run_dir) / ROLLOUTS
    found: dict[int, list[tuple[int, Path]]] = {}
    for path in sorted(folder.glob("step_*.safetensors")) if folder.is_dir() else []:
        match = _NAME.match(path.name)
        if match is None or (steps is not None and int(match[1]) not in steps):
            continue
        found.setdefault(int(match[1]), []).append((int(match[2]), path))
    return {step: [load_rollout(p) for _, p in sorted(ranks)] for step, ranks in sorted(found.items())}


__all__ = ["ROLLOUTS", "RolloutSaver", "check_rollout_filled", "check_rollout_record", "read_rollouts",
           "rollout_path"]

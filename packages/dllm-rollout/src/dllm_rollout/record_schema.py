"""The rollout record: its version, its fields, and which of them each decoder or engine fills.

A `RolloutBatch` is the one rollout record every decoder (masked, block, tree) and engine adapter
(lmdeploy, SGLang) returns. Its fields are listed once, in `RECORD_FIELDS` (name -> shape, dtype,
meaning); `record_fields_filled` says which of them a backend fills for given sampling settings,
so a run whose algorithm needs a field the backend cannot give is refused before any model loads
(`dllm_train.check_rollout_record`). `RECORD_VERSION` numbers the layout of stored records
(`dllm_rollout.save_rollout`); a reader refuses a record of a newer version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dllm_rollout.config import SamplingConfig

RECORD_VERSION = 1
"""The version of the rollout record's layout (`RolloutBatch.version`); raised when a field changes meaning."""


@dataclass(frozen=True)
class RecordField:
    """One field of the rollout record.

    Attributes:
        shape: its shape in the batch's letters (B samples, P prompt columns, R response columns,
            S recorded steps, T tail columns), "-" for a non-tensor.
        dtype: the tensor dtype (or the Python type of a non-tensor).
        meaning: what it holds.
        in_extras: it lives in `RolloutBatch.extras` under its name (not a dataclass field).
    """

    shape: str
    dtype: str
    meaning: str
    in_extras: bool = False


RECORD_FIELDS: Mapping[str, RecordField] = MappingProxyType({
    "prompt_ids": RecordField("[B, P]", "long", "left-padded prompt ids"),
    "prompt_mask": RecordField("[B, P]", "bool", "True on real prompt tokens"),
    "response_ids": RecordField("[B, R]", "long", "generated tokens (prompt excluded)"),
    "response_mask": RecordField("[B, R]", "bool", "True on response tokens that count"),
    "seeds": RecordField("[B]", "long", "per-sample seeds (a native rollout replays from its seed)"),
    "version": RecordField("-", "int", "RECORD_VERSION of the record's layout"),
    "config": RecordField("-", "SamplingConfig", "the sampling settings that produced the batch"),
    "forwards": RecordField("[B]", "long", "denoising forwards of the policy spent on each sample: the steps "
                            "it took (a tree leaf: the steps on its path from the root); cache store passes "
                            "and reference-model forwards are not counted"),
    "unmask_step": RecordField("[B, R]", "long", "denoising step at which each response token was committed "
                               "(-1 if never)"),
    "step_logp": RecordField("[B, R]", "float32", "log-prob of each committed token on the canvas of its step"),
    "ref_step_logp": RecordField("[B, R]", "float32", "the same log-prob under the reference model"),
    "step_canvas": RecordField("[B, S, R]", "long", "the response canvas before each of the sample's steps"),
    "step_x0": RecordField("[B, S, R]", "long", "the clean prediction at each step"),
    "step_confidence": RecordField("[B, S, R]", "float32", "the sampler's confidence at each step (NaN where none)"),
    "tail_ids": RecordField("[B, T]", "long", "block diffusion: the decoded rest of the terminal block after "
                            "the response (mask id padded)", in_extras=True),
    "tail_unmask_step": RecordField("[B, T]", "long", "the commit step of each `tail_ids` token (-1 padded)",
                                    in_extras=True),
    "num_edits": RecordField("[B]", "long", "token editing: the row's token-to-token edits", in_extras=True),
})
"""Every field of the rollout record, by name (see `RolloutBatch` for the details)."""

ALWAYS = frozenset({"prompt_ids", "prompt_mask", "response_ids", "response_mask", "seeds", "version", "config"})
"""Fields every backend fills."""
TRAJECTORY = frozenset({"unmask_step", "step_logp"})
"""Fields `SamplingConfig.record_trajectory` asks for."""
STEPS = frozenset({"step_canvas", "step_x0", "step_confidence"})
"""Fields `SamplingConfig.record_steps` asks for."""
REPLAY = TRAJECTORY | STEPS | {"ref_step_logp", "tail_ids", "tail_unmask_step"}
"""Fields that describe the decoding trajectory (what token editing makes unreplayable)."""

BACKENDS = ("masked", "block", "tree", "lmdeploy", "sglang")
"""Who decodes: the native masked, block and tree decoders, and the engine adapters."""


def backend_of(sampling: SamplingConfig) -> str:
    """The backend that decodes `sampling` through `dllm_rollout.decode` or `rollout.engine`:
    "block" or "masked" for `engine="native"` (by `block_diffusion`), else the engine's name."""
    if sampling.engine == "native":
        return "block" if sampling.block_diffusion else "masked"
    return sampling.engine


def record_fields_filled(sampling: SamplingConfig, *, backend: str | None = None,
                         reference: bool = False) -> frozenset[str]:
    """The record fields `backend` fills when decoding with `sampling` (tests check each against
    the decoder's actual output).

    Args:
        sampling: the decoding settings (`record_trajectory`, `record_steps`, `editing_threshold`).
        backend: one of `BACKENDS` (None: `backend_of(sampling)`).
        reference: a reference model is scored on the rollout's canvases (native decoders).

    Returns:
        names of `RECORD_FIELDS`: always `ALWAYS`; the native decoders also `forwards`, the
        trajectory when asked, the per-step records when asked (masked, block), `ref_step_logp`
        with a reference (masked, block); lmdeploy 0.18 reports no steps, so nothing more; SGLang
        `unmask_step` (its step maps) when the trajectory is asked.

    Raises:
        ValueError: an unknown backend.
    """
    name = backend_of(sampling) if backend is None else backend
    if name not in BACKENDS:
        raise ValueError(f"rollout backend {name!r} unknown; choose one of {BACKENDS}")
    if name == "lmdeploy":
        return ALWAYS
    if name == "sglang":
        return ALWAYS | ({"unmask_step"} if sampling.record_trajectory else set())
    if name == "tree":  # the tree is built from the trajectory; no reference, no per-step records
        return ALWAYS | {"forwards"} | TRAJECTORY
    out = set(ALWAYS | {"forwards"})
    if sampling.record_trajectory:
        out |= TRAJECTORY
    if sampling.record_steps:
        out |= STEPS
    if reference:
        out.add("ref_step_logp")
    if name == "block":
        if sampling.record_trajectory:
            out |= {"tail_ids", "tail_unmask_step"}
        if sampling.editing_threshold is not None:
            out.add("num_edits")
    return frozenset(out)


def requested_fields(sampling: SamplingConfig) -> frozenset[str]:
    """The record fields `sampling`'s own switches ask for (`record_trajectory`, `record_steps`)."""
    return (TRAJECTORY if sampling.record_trajectory else frozenset()) | (STEPS if sampling.record_steps
                                                                          else frozenset())


def check_field_names(names: Iterable[str], *, owner: str) -> frozenset[str]:
    """`names` as a frozenset, refusing one that is not a record field (`owner` names who declared it)."""
    out = frozenset(names)
    unknown = sorted(out - set(RECORD_FIELDS))
    if unknown:
        raise ValueError(f"{owner}: {unknown} are not rollout record fields; valid: {sorted(RECORD_FIELDS)}")
    return out


def record_settings(sampling: SamplingConfig, fields: Iterable[str]) -> SamplingConfig:
    """`sampling` with the switches that make the native decoders fill `fields` turned on
    (`record_trajectory` for the trajectory and the tail, `record_steps` for per-step records).
    `ref_step_logp` needs a reference model instead (`decode(..., ref_model=...)`)."""
    wanted = frozenset(fields)
    trajectory = sampling.record_trajectory or bool(wanted & (TRAJECTORY | {"tail_ids", "tail_unmask_step"}))
    steps = sampling.record_steps or bool(wanted & STEPS)
    if (trajectory, steps) == (sampling.record_trajectory, sampling.record_steps):
        return sampling
    return dataclasses.replace(sampling, record_trajectory=trajectory, record_steps=steps)


__all__ = ["ALWAYS", "BACKENDS", "RECORD_FIELDS", "RECORD_VERSION", "REPLAY", "RecordField", "STEPS", "TRAJECTORY",
           "backend_of", "check_field_names", "record_fields_filled", "record_settings", "requested_fields"]

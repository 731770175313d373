"""The rollout record on disk: one safetensors file, its JSON header holding the version and the
sampling settings (docs/generation.md#rollout-output).

Tensors are stored under their field names (`extras` under `extras/<key>`, every key kept); the
header's `__metadata__` holds `format`, `version` (`RECORD_VERSION` of the batch) and `config`
(the `SamplingConfig` as JSON, or null). A reader refuses a record of a version newer than its own.
Fields a subclass of `RolloutBatch` adds are not stored.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.config import SamplingConfig, SpeedConfig
from dllm_rollout.record_schema import RECORD_FIELDS, RECORD_VERSION

FORMAT = "dllm_rollout.RolloutBatch"
"""The `format` entry of a stored record's header."""
EXTRAS = "extras/"
"""The name prefix of `RolloutBatch.extras` tensors in the file."""


def rollout_bytes(batch: RolloutBatch) -> bytes:
    """`batch` as the bytes of one safetensors file (tensors copied to the CPU)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, spec in RECORD_FIELDS.items():
        value = None if spec.in_extras else getattr(batch, name)
        if isinstance(value, torch.Tensor):
            tensors[name] = value.detach().cpu().contiguous().clone()
    for key, value in batch.extras.items():
        tensors[EXTRAS + key] = value.detach().cpu().contiguous().clone()
    config = None if batch.config is None else dataclasses.asdict(batch.config)
    meta = {"format": FORMAT, "version": str(batch.version), "config": json.dumps(config)}
    return bytes(save_tensors(tensors, metadata=meta))


def _header(data: bytes, source: str) -> dict[str, str]:
    """The `__metadata__` of a safetensors file's JSON header."""
    if len(data) < 8:
        raise ValueError(f"{source}: not a safetensors file ({len(data)} bytes)")
    (size,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as err:
        raise ValueError(f"{source}: not a safetensors file (unreadable header)") from err
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{source}: not a stored rollout record (no format={FORMAT!r} in its header)")
    return {str(k): str(v) for k, v in meta.items()}


def _config(text: str) -> SamplingConfig | None:
    """The SamplingConfig stored as JSON (null: None)."""
    raw: Any = json.loads(text)
    if raw is None:
        return None
    speed = SpeedConfig(**raw.pop("speed", {}))
    return SamplingConfig(**raw, speed=speed)


def rollout_from_bytes(data: bytes, *, source: str = "rollout record") -> RolloutBatch:
    """The RolloutBatch stored in `data` (`rollout_bytes`).

    Raises:
        ValueError: `data` is no stored rollout record, or one of a newer version than this reader's.
    """
    meta = _header(data, source)
    version = int(meta["version"])
    if version > RECORD_VERSION:
        raise ValueError(f"{source}: rollout record version {version} is newer than this dllm_rollout reads "
                         f"(version {RECORD_VERSION}); upgrade dllm-rollout to read it")
    tensors = load_tensors(data)
    extras = {k[len(EXTRAS):]: v for k, v in tensors.items() if k.startswith(EXTRAS)}
    fields = {k: v for k, v in tensors.items() if not k.startswith(EXTRAS)}
    unknown = sorted(set(fields) - set(RECORD_FIELDS))
    if unknown:
        raise ValueError(f"{source}: tensors {unknown} are not rollout record fields of version {RECORD_VERSION}")
    return RolloutBatch(**fields, config=_config(meta["config"]), extras=extras, version=version)


def save_rollout(batch: RolloutBatch, path: str | Path) -> None:
    """Write `batch` to `path` as one safetensors file (`rollout_bytes`)."""
    Path(path).write_bytes(rollout_bytes(batch))


def load_rollout(path: str | Path) -> RolloutBatch:
    """Read the RolloutBatch stored at `path` (`save_rollout`); refuses a newer version."""
    return rollout_from_bytes(Path(path).read_bytes(), source=str(path))


__all__ = ["FORMAT", "load_rollout", "rollout_bytes", "rollout_from_bytes", "save_rollout"]

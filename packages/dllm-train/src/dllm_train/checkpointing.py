"""Atomic checkpoints of a training run, and exact resume.

A checkpoint is a folder `checkpoints/<phase>-<step>/` holding the model as a release-layout
checkpoint (`model/`: config.json + safetensors) and `trainer_state.pt` (optimizer, counters,
phase results); a sharded owner (the Ray backend) adds `shards/`, its ranks' own shards of the
parameters and optimizer state. It is written under a temporary name and renamed into place, so a crash at any
moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dllm_models import save_model, weight_files

_NAME = re.compile(r"^(?P<order>\d+)-(?P<phase>[a-z]+)-(?P<step>\d{6})$")


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    path: Path
    order: int
    phase: str
    step: int


def _path(output_dir: Path, order: int, phase: str, step: int) -> Path:
    return output_dir / "checkpoints" / f"{order}-{phase}-{step:06d}"


SHARDS = "shards"
"""Folder of a checkpoint holding parameters and optimizer state as every rank's own shards
(`torch.distributed.checkpoint`), written by a sharded owner (`workflow.ShardedStateful`)."""


@contextmanager
def new_checkpoint(output_dir: Path, *, order: int, phase: str, step: int, keep: int = 2) -> Iterator[Path]:
    """A checkpoint folder to fill inside the block, made visible atomically when the block ends.

    Inside, the folder has a temporary name (ignored by `list_checkpoints`); at the end it is renamed
    to `checkpoints/<order>-<phase>-<step>` and only the newest `keep` checkpoints stay. If the
    block raises, the folder is removed and the previous checkpoints are untouched; a write error
    (full disk) becomes one `OSError` naming the free space and the fix.
    """
    final = _path(output_dir, order, phase, step)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except (OSError, RuntimeError, SafetensorError) as err:  # torch.save: RuntimeError; safetensors: its own
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free / 2**30
        raise OSError(f"could not write the checkpoint {final} ({type(err).__name__}: {err}); {free:.1f} GiB free "
                      "there. A checkpoint holds the weights and the optimizer state (AdamW: twice the weights): "
                      "free disk space or pass --output-dir on a larger disk; the previous checkpoint, if any, "
                      "is intact and the run resumes from it") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)


def write_checkpoint_files(folder: Path, *, model: Any, state: dict[str, Any], tokenizer: Any = None) -> None:
    """The model (`model/`, release layout) and the trainer state (`trainer_state.pt`) of a checkpoint."""
    save_model(model, folder / "model", tokenizer=tokenizer)
    with open(folder / "trainer_state.pt", "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def save_checkpoint(
    output_dir: Path, *, order: int, phase: str, step: int, model: Any, state: dict[str, Any],
    tokenizer: Any = None, keep: int = 2,
) -> Path:
    """Write a checkpoint atomically and keep only the newest `keep` ones.

    Args:
        output_dir: run folder; checkpoints go to `output_dir/checkpoints/`.
        order: phase order (0 for the first phase, 1 for the second...), so phases sort.
        phase: phase name ("sft", "rl").
        step: completed steps of that phase.
        model: the module to save.
        state: trainer state (optimizer state, counters, results) saved with torch.save.
        tokenizer: optional tokenizer saved with the model.
        keep: number of checkpoints kept.
    """
    with new_checkpoint(output_dir, order=order, phase=phase, step=step, keep=keep) as folder:
        write_checkpoint_files(folder, model=model, state=state, tokenizer=tokenizer)
    return _path(output_dir, order, phase, step)


def list_checkpoints(output_dir: Path) -> list[CheckpointRef]:
    """Complete checkpoints, oldest first (temporary folders are ignored)."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    refs = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / "trainer_state.pt").is_file() and (p / "model" / "config.json").is_file():
            refs.append(CheckpointRef(p, int(m["order"]), m["phase"], int(m["step"])))
    return sorted(refs, key=lambda r: (r.order, r.step))


def latest_checkpoint(output_dir: Path) -> CheckpointRef | None:
    refs = list_checkpoints(output_dir)
    return refs[-1] if refs else None


def load_checkpoint(ref: CheckpointRef, model: Any) -> dict[str, Any]:
    """Load the checkpoint's weights into `model` in place and return its trainer state.

    The tensors are read by name, so a model with LoRA adapters injected (whose state dict holds
    `base_layer` and `lora_A/B` names that no plain family module has) resumes like any other.
    """
    dtype = next(model.parameters()).dtype
    folder = ref.path / "model"
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_files(folder).values())):
        weights.update({k: v.to(dtype) if v.is_floating_point() else v
                        for k, v in load_file(str(folder / shard)).items()})
    model.load_state_dict(weights, strict=True)
    state: dict[str, Any] = torch.load(ref.path / "trainer_state.pt", weights_only=False)
    return state

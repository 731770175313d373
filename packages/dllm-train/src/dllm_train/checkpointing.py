"""Atomic checkpoints of a training run, and exact resume.

A checkpoint is a folder `checkpoints/<phase>-<step>/` holding the model as a release-layout
checkpoint (`model/`: config.json + safetensors) and `trainer_state.pt` (optimizer, counters,
phase results); a sharded owner (the Ray backend) adds `shards/`, its ranks' own shards of the
parameters and optimizer state. It is written under a temporary name and renamed into place, so a crash at any
moment leaves either the previous checkpoint or the new one, never half of one.

A checkpoint is complete only with its `manifest.json`, written last: every file's size, and the
SHA-256 of the files up to `CHECKSUM_LIMIT` bytes (configs, tokenizer, the counters of a sharded
checkpoint). Sizes catch what a crash or a full disk leaves (a truncated file), at no cost; a
checksum of the weights and optimizer state would read all of them again at every save, so the
large files are verified by size and by loading. `recover_checkpoints` (run when a run starts) removes the
leftovers of interrupted writes and deletions, and sets aside (renames, never deletes) every
checkpoint newer than the newest intact one, each named in one log line.

A run folder may come from elsewhere, so reading one never unpickles: `trainer_state.pt` is read
with `torch.load(weights_only=True)` (tensors and plain data), and a checkpoint without a manifest
(the layout written before manifests) is refused unless the caller trusts it (`trust_legacy`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dllm_models import save_leftovers, save_model, weight_files

logger = logging.getLogger(__name__)
MANIFEST = "manifest.json"
CHECKSUM_LIMIT = 1 << 20
"""Files up to this many bytes get a SHA-256 in the manifest; larger ones are verified by size."""
_LEFTOVER = (".tmp-", ".deleting-")
_NAME = re.compile(r"^(?P<order>\d+)-(?P<phase>[a-z]+)-(?P<step>\d{6})$")


@dataclass(frozen=True)
class CheckpointRef:
    """A complete checkpoint on disk."""

    path: Path
    order: int
    phase: str
    step: int


def checkpoint_path(output_dir: Path, order: int, phase: str, step: int) -> Path:
    """Where the checkpoint of (order, phase, step) of a run folder lives."""
    return output_dir / "checkpoints" / f"{order}-{phase}-{step:06d}"


SHARDS = "shards"
"""Folder of a checkpoint holding parameters and optimizer state as every rank's own shards
(`torch.distributed.checkpoint`), written by a sharded owner (`run.ShardedStateful`)."""


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written (full disk...): one message naming the folder, the
    free space and the fix; `filename` is the checkpoint's folder."""

    def __init__(self, folder: Path, message: str) -> None:
        super().__init__(message)
        self.filename = str(folder)

    def __str__(self) -> str:
        return str(self.args[0])


@contextmanager
def new_checkpoint(output_dir: Path, *, order: int, phase: str, step: int, keep: int = 2) -> Iterator[Path]:
    """A checkpoint folder to fill inside the block, made visible atomically when the block ends.

    Inside, the folder has a temporary name (ignored by `list_checkpoints`); at the end it is renamed
    to `checkpoints/<order>-<phase>-<step>` and only the newest `keep` checkpoints stay. If the
    block raises, the folder is removed and the previous checkpoints are untouched; a write error
    (full disk) becomes one `OSError` naming the free space and the fix.
    """
    final = checkpoint_path(output_dir, order, phase, step)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        yield tmp
        write_manifest(tmp)
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    except (OSError, RuntimeError, SafetensorError) as err:  # torch.save: RuntimeError; safetensors: its own
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free / 2**30
        raise CheckpointWriteError(final, f"could not write the checkpoint {final} ({type(err).__name__}: {err}); {free:.1f} GiB free "
                      "there. A checkpoint holds the weights and the optimizer state (AdamW: twice the weights): "
                      "free disk space or pass --output-dir on a larger disk; the previous checkpoint, if any, "
                      "is intact and the run resumes from it") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(output_dir)[:-keep]:
        _remove(old.path)


def _remove(folder: Path) -> None:
    """Delete a checkpoint folder: renamed to `.deleting-*` first, so a crash mid-way leaves no
    half-deleted folder under a checkpoint's name (`recover_checkpoints` finishes the job)."""
    gone = folder.with_name(f".deleting-{folder.name}-{os.getpid()}")
    os.replace(folder, gone)
    shutil.rmtree(gone, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    """Write `folder/manifest.json`: every file's size, and the SHA-256 of the small ones (fsynced)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        size = path.stat().st_size
        entry: dict[str, Any] = {"size": size}
        if size <= CHECKSUM_LIMIT:
            entry["sha256"] = _sha256(path)
        files[path.relative_to(folder).as_posix()] = entry
    with open(folder / MANIFEST, "w") as fh:
        json.dump({"files": files}, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def damage(folder: Path, *, trust_legacy: bool = False) -> str | None:
    """What is wrong with a checkpoint folder (None: its manifest holds and every file matches it).

    A folder of the layout written before manifests (`trainer_state.pt` and `model/config.json`,
    no manifest) passes only with `trust_legacy`: nothing verifies where its files came from.
    """
    manifest = folder / MANIFEST
    if not manifest.is_file():
        if _legacy(folder):  # written before manifests, renamed into place whole: verified by reading it
            return None if trust_legacy else LEGACY
        return f"no {MANIFEST} (an incomplete write)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MANIFEST} ({err})"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']} (truncated)"
        if "sha256" in entry and _sha256(path) != entry["sha256"]:
            return f"{name} does not match its checksum"
    return None


def set_aside(folder: Path, why: str) -> Path:
    """Rename a damaged checkpoint to `<name>.damaged-<time>` (never deleted) and log one line."""
    aside = folder.with_name(f"{folder.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside, n = folder.with_name(f"{folder.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
    os.replace(folder, aside)
    logger.warning("checkpoint %s is damaged (%s): set aside as %s; resuming from the newest intact one",
                   folder, why, aside.name)
    return aside


def clean_leftovers(output_dir: Path) -> list[Path]:
    """Remove the temporary and half-deleted folders that interrupted writes and deletions leave in
    `output_dir/checkpoints/`, and those of an interrupted export into `output_dir` (`save_model`'s
    `.model.tmp-*` copy and `.model.old-*` predecessor, `dllm_models.save_leftovers`); returns what
    was removed. Only a run folder's single writer may call it (a concurrent writer's temporary
    folder would go too)."""
    root = output_dir / "checkpoints"
    gone = [p for p in root.iterdir() if p.name.startswith(_LEFTOVER)] if root.is_dir() else []
    exports = save_leftovers(output_dir)
    for p in gone + exports:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    if gone:
        logger.info("removed %d leftover folder(s) of interrupted checkpoint writes in %s", len(gone), root)
    if exports:
        logger.info("removed %d leftover folder(s) of an interrupted export in %s: %s", len(exports), output_dir,
                    ", ".join(p.name for p in exports))
    return gone + exports


def recover_checkpoints(output_dir: Path, *, trust_legacy: bool = False) -> CheckpointRef | None:
    """The newest intact checkpoint of a run folder, after cleaning up (see the module docstring).

    Leftovers are removed (`clean_leftovers`) and every checkpoint newer than the newest intact
    one is renamed aside (`set_aside`) with one warning line each.

    Raises:
        LegacyCheckpointRefused: the newest checkpoint has no manifest (the layout written before
            manifests, or a folder from elsewhere) and `trust_legacy` is False.
    """
    clean_leftovers(output_dir)
    for ref in reversed(_named_checkpoints(output_dir)):
        why = damage(ref.path, trust_legacy=trust_legacy)
        if why is None:
            return ref
        if why == LEGACY:
            raise LegacyCheckpointRefused(
                f"checkpoint {ref.path} has no {MANIFEST} (the layout written before manifests, or a folder from "
                "elsewhere): nothing verifies its files. Pass --trust-legacy-checkpoint (`trust_legacy=True`) to "
                "resume from it if you wrote it, or choose a new --output-dir")
        set_aside(ref.path, why)
    return None


LEGACY = f"no {MANIFEST} (the layout written before manifests)"
"""`damage`'s answer for a legacy checkpoint that is not trusted."""


class LegacyCheckpointRefused(ValueError):
    """The newest checkpoint of a run folder has no manifest and legacy checkpoints are not trusted."""


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
    return checkpoint_path(output_dir, order, phase, step)


def _named_checkpoints(output_dir: Path) -> list[CheckpointRef]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    refs = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir():
            refs.append(CheckpointRef(p, int(m["order"]), m["phase"], int(m["step"])))
    return sorted(refs, key=lambda r: (r.order, r.step))


def _legacy(folder: Path) -> bool:
    """A checkpoint of the layout written before manifests (trainer_state.pt and model/config.json)."""
    return (folder / "trainer_state.pt").is_file() and (folder / "model" / "config.json").is_file()


def list_checkpoints(output_dir: Path) -> list[CheckpointRef]:
    """Checkpoints with a manifest (or of the layout written before manifests), oldest first;
    temporary and set-aside folders are ignored. `damage` verifies one."""
    return [r for r in _named_checkpoints(output_dir) if (r.path / MANIFEST).is_file() or _legacy(r.path)]


def latest_checkpoint(output_dir: Path, *, trust_legacy: bool = False) -> CheckpointRef | None:
    """The newest intact checkpoint (`damage` finds nothing wrong), without touching the folder."""
    for ref in reversed(_named_checkpoints(output_dir)):
        if damage(ref.path, trust_legacy=trust_legacy) is None:
            return ref
    return None


def read_checkpoint(ref: CheckpointRef) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights by name, trainer state) of a checkpoint, read completely before anything uses them.

    Raises:
        CheckpointDamaged: a file cannot be read (the manifest held, but the bytes do not parse).
    """
    folder = ref.path / "model"
    try:
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_files(folder).values())):
            weights.update(load_file(str(folder / shard)))
        # tensors and plain data only: a trainer state is never unpickled (that could run code)
        state: dict[str, Any] = torch.load(ref.path / "trainer_state.pt", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" not in str(err).lower():
            raise CheckpointDamaged(f"{type(err).__name__}: {str(err).splitlines()[0]}") from err
        raise ValueError(
            f"{ref.path / 'trainer_state.pt'} holds objects other than tensors and plain data, which only "
            "unpickling (running code from the file) could read: it was not written by this trainer. Refused; "
            "choose a new --output-dir") from None
    except (OSError, ValueError, RuntimeError, EOFError, SafetensorError, KeyError) as err:
        raise CheckpointDamaged(f"{type(err).__name__}: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointDamaged(f"trainer_state.pt holds a {type(state).__name__}, not a dict")
    return weights, state


class CheckpointDamaged(Exception):
    """A checkpoint whose files cannot be read."""


def load_checkpoint(ref: CheckpointRef, model: Any) -> dict[str, Any]:
    """Load the checkpoint's weights into `model` in place and return its trainer state.

    The tensors are read by name, so a model with LoRA adapters injected (whose state dict holds
    `base_layer` and `lora_A/B` names that no plain family module has) resumes like any other.
    Every file is read before the model is touched, so a damaged checkpoint leaves it as it was.
    """
    dtype = next(model.parameters()).dtype
    weights, state = read_checkpoint(ref)
    check_fits(ref, model, weights)
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}, strict=True)
    return state


def check_fits(ref: CheckpointRef, model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Raise one `CheckpointMismatch` if the checkpoint's tensors are not the model's (names, shapes)."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    shapes = [(k, tuple(weights[k].shape), own[k]) for k in sorted(own) if k in weights
              and tuple(weights[k].shape) != own[k]]
    if not (missing or unexpected or shapes):
        return
    if shapes:
        k, theirs, ours = shapes[0]
        what = f"{len(shapes)} tensor(s) of another shape (first: {k} is {list(theirs)} there, {list(ours)} here)"
    else:
        what = (f"{len(missing)} of the model's tensors missing (first: {missing[0]})" if missing
                else f"{len(unexpected)} tensor(s) the model lacks (first: {unexpected[0]})")
    raise CheckpointMismatch(
        f"checkpoint {ref.path} does not fit the model of this run: {what}. A run folder's checkpoints hold "
        "the model of the config it was started with: resume with that model (the folder's config.json), "
        "or choose a new --output-dir")


class CheckpointMismatch(ValueError):
    """A checkpoint whose tensors are not those of the model it is loaded into (another model shape)."""


def resume_checkpoint(output_dir: Path, model: Any, *,
                      trust_legacy: bool = False) -> tuple[CheckpointRef | None, dict[str, Any]]:
    """Load the newest intact, readable checkpoint of a run folder into `model`: (its ref, its state),
    or (None, {}) with none. Leftovers are cleaned first and damaged checkpoints set aside
    (`recover_checkpoints`), including one whose files pass the manifest but do not parse.

    Raises:
        LegacyCheckpointRefused: the newest checkpoint has no manifest and `trust_legacy` is False.
        CheckpointMismatch: the checkpoint holds another model (nothing is set aside or loaded).
        ValueError: its trainer state would need unpickling to be read.
    """
    while (ref := recover_checkpoints(output_dir, trust_legacy=trust_legacy)) is not None:
        try:
            return ref, load_checkpoint(ref, model)
        except CheckpointDamaged as err:
            set_aside(ref.path, str(err))
    return None, {}

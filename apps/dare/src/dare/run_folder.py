"""The run folder's identity: a rerun into an existing folder resumes the run it holds, or is refused.

A run folder holds one run, described by its `config.json` (and, when finished, `summary.json`).
A rerun with the same `--output-dir` resumes it, so the new resolved config is compared with the
saved one before anything is written:

- fields in `RESUMABLE` (the step budget and the logging, evaluation and checkpoint periods,
  metric sinks, CPU threads, the optimizer-state offload, which changes no value) may change: they
  do not change what the steps already taken mean;
- any other difference is refused with the differing fields listed (`dotted.key: old -> new`);
  `dare train ... --allow-config-change` (or `config_change_allowed(True)` around the call)
  accepts it, and the folder's config.json records the new config once the folder's checkpoint
  has loaded into the new run's model (`start_run`; a checkpoint of another model shape is one
  error and leaves config.json as it was);
- a run of another kind (a quick start's folder for an RL recipe, an SFT folder for an RL
  recipe...) is refused even with `--allow-config-change`: its checkpoints are of other phases;
- the content of the data files (`data.train_files`, fingerprinted by SHA-256 in the folder's
  `data.json`) counts as a setting: a file replaced under the same path is refused (or accepted
  with `--allow-config-change`) like any other change;
- `trainer.max_steps` (or `sft.steps` of an SFT recipe) may not drop below the steps the folder
  has already completed: the finished steps cannot be undone, and the folder's summary.json keeps
  describing them. Raise the budget, or choose a new `--output-dir`.

A field the saved config.json lacks (added to the config since) reads as its default; a field only
the saved config has (removed since) counts as a change. A folder holding no checkpoint and no
metrics (what a start that failed before its first step leaves) holds no run yet: it is reused
with the new config.

One writer per folder: `open_run_folder` takes `.lock` (an exclusive `flock` held for the life
of the process, with the holder's pid, host and start time inside). A second run into a busy
folder is refused at once naming the holder; a lock file left by a dead process holds no `flock`
and is taken over with one notice. `release_run_folder` (or the process's exit) drops it.

A run folder is untrusted input: a folder holding a symbolic link anywhere is refused before
anything is written (a link would send a write outside it), and the lock, config.json and the
metrics are opened without following links (`dllm_train.folder_files`).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dare.config import RunConfig, load_config, run_kind, to_dict
from dare.inputs import check_output_dir
from dllm_train import Run, TrainerConfig
from dllm_train.folder_files import find_symlinks, open_nofollow, replace_text, write_new

logger = logging.getLogger(__name__)

# Fields a resumed run may change (prefix match for the `trainer.wandb*` group).
RESUMABLE = ("trainer.max_steps", "sft.steps", "trainer.log_every", "trainer.eval_every", "trainer.save_every",
             "trainer.keep_checkpoints", "trainer.tensorboard", "trainer.wandb", "trainer.num_threads",
             "trainer.max_nonfinite_steps", "trainer.optimizer_offload")
LOCK = ".lock"
_HELD: dict[Path, int] = {}  # run folder (resolved) -> fd of its lock, held by this process
_PENDING: dict[Path, RunConfig] = {}  # run folder (resolved) -> an accepted config change not yet written

_ALLOW = contextvars.ContextVar("allow_config_change", default=False)
_TRUST_LEGACY = contextvars.ContextVar("trust_legacy_checkpoint", default=False)


@contextlib.contextmanager
def legacy_checkpoints_trusted(trust: bool = True) -> Iterator[None]:
    """Within the block, a run resumes from a checkpoint without a manifest (the layout written
    before manifests; the CLI's `--trust-legacy-checkpoint`); otherwise such a checkpoint is refused."""
    token = _TRUST_LEGACY.set(trust)
    try:
        yield
    finally:
        _TRUST_LEGACY.reset(token)


@contextlib.contextmanager
def config_change_allowed(allow: bool = True) -> Iterator[None]:
    """Within the block, `open_run_folder` accepts a config that differs from the folder's (the
    CLI's `--allow-config-change`)."""
    token = _ALLOW.set(allow)
    try:
        yield
    finally:
        _ALLOW.reset(token)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested dict (`{"a": {"b": 1}}` -> `{"a.b": 1}`); lists stay values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"))
    return out


def _resumable(key: str) -> bool:
    return key in RESUMABLE or key.startswith("trainer.wandb")


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields that differ between two resolved configs, outside `RESUMABLE`: dotted key -> (old, new).

    A field present on one side only reads as `<absent>` on the other.
    """
    a, b = flatten(old), flatten(new)
    missing = "<absent>"
    return {k: (a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing) and not _resumable(k)}


def completed_steps(output_dir: Path) -> tuple[str, int]:
    """(budget field, completed steps) of the latest phase the folder has a checkpoint of:
    `sft.steps` for an SFT phase, else `trainer.max_steps`; ("", 0) with no checkpoint."""
    from dllm_train import latest_checkpoint

    ref = latest_checkpoint(output_dir, trust_legacy=True)  # names only: nothing is read from it
    if ref is None:
        return "", 0
    return ("sft.steps" if ref.phase == "sft" else "trainer.max_steps"), ref.step


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that left no readable pid"


def _busy(output_dir: Path) -> str | None:
    """Who holds the folder's lock (None: nobody; this process's own lock counts as free)."""
    path = output_dir / LOCK
    if output_dir.resolve() in _HELD or not path.is_file():
        return None
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # closing drops a lock this probe may have taken
    return None


def _refuse_busy(output_dir: Path, holder: str) -> None:
    raise ValueError(f"{output_dir} is in use by another run ({holder}): one run writes a folder at a time. "
                     f"Wait for it to finish, stop it, or choose a new --output-dir")


def lock_run_folder(output_dir: Path) -> None:
    """Take the folder's single-writer lock for this process (see the module docstring)."""
    key = output_dir.resolve()
    if key in _HELD:
        return
    path = output_dir / LOCK
    while True:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)  # a link planted as .lock is refused, never written
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            _refuse_busy(output_dir, _holder(path))
        try:  # the holder may have removed the file between our open and our lock: lock the one on disk
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = os.read(fd, 4096).decode(errors="replace").strip()
    if stale:
        logger.warning("%s: taking over the lock left by a process that is gone (%s)", output_dir,
                       _holder(path))
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    _HELD[key] = fd


def release_run_folder(output_dir: Path) -> None:
    """Drop this process's lock of `output_dir` (nothing if it holds none)."""
    fd = _HELD.pop(output_dir.resolve(), None)
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(output_dir / LOCK)  # before unlocking, so no other process locks a file about to go
    os.close(fd)


_OWNER = os.getpid()


@atexit.register
def _release_all() -> None:
    if os.getpid() != _OWNER:  # a forked child inherits the table, not the lock's ownership
        return
    for folder in list(_HELD):
        release_run_folder(folder)


def holds_a_run(output_dir: Path) -> bool:
    """Whether the folder holds a run's work (a checkpoint or metrics), not only a failed start's config."""
    return (output_dir / "checkpoints").is_dir() and any((output_dir / "checkpoints").iterdir()) \
        or any(output_dir.glob("*metrics.jsonl"))


def check_extras(cfg: RunConfig) -> None:
    """Raise if a switched-on metric sink's package is not installed (`trainer.wandb=true`)."""
    import importlib.util
    import sys

    from dllm_train.metrics import WANDB_INSTALL_HINT

    if not cfg.trainer.wandb:
        return
    loaded = "wandb" in sys.modules  # imported already (None there: import blocked)
    if (sys.modules["wandb"] is None) if loaded else importlib.util.find_spec("wandb") is None:
        raise ValueError(f"trainer.wandb=true needs the wandb package: {WANDB_INSTALL_HINT}, or set trainer.wandb=false")


def write_config(cfg: RunConfig, output_dir: Path) -> None:
    """Write the folder's config.json atomically (through `.config.json.tmp`, never through a link),
    and the content fingerprints of its data files (`DATA_STATE`, `data_fingerprints`)."""
    tmp = output_dir / ".config.json.tmp"
    write_new(tmp, json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    os.replace(tmp, output_dir / "config.json")
    fingerprints = data_fingerprints(cfg)
    if fingerprints:
        replace_text(output_dir / DATA_STATE, json.dumps({"data.train_files": fingerprints}, indent=2))


DATA_STATE = "data.json"
"""The run folder's record of its data files' content: `{"data.train_files": {path: sha256}}`."""
_DIGESTS: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime_ns) -> sha256, per process


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def data_fingerprints(cfg: RunConfig) -> dict[str, str]:
    """SHA-256 of every file among the run's `data.train_files` entries (shipped dataset names and
    runs without data files have none), by the entry as written."""
    data = getattr(cfg, "data", None)
    files = [e.strip() for e in str(getattr(data, "train_files", "")).split(",") if e.strip()]
    return {entry: _sha256(Path(entry)) for entry in files if Path(entry).is_file()}


def data_changes(cfg: RunConfig, output_dir: Path) -> dict[str, tuple[Any, Any]]:
    """Data files whose content differs from the folder's record (`DATA_STATE`): the key
    `data.train_files content of <path>` -> (old sha256, new sha256), 12 hex digits each. A folder
    without the record (written before it existed) compares nothing."""
    path = output_dir / DATA_STATE
    try:
        saved = json.loads(path.read_text())["data.train_files"] if path.is_file() else {}
    except (OSError, ValueError, KeyError, TypeError):
        saved = {}
    if not isinstance(saved, dict):
        saved = {}
    new = data_fingerprints(cfg)
    return {f"data.train_files content of {entry}": (str(saved[entry])[:12], digest[:12])
            for entry, digest in new.items() if entry in saved and saved[entry] != digest}


def check_no_symlinks(output_dir: Path) -> None:
    """Raise if the folder holds a symbolic link anywhere: a run writes its files in place, and a
    link (planted in a folder that came from elsewhere) would send a write outside the folder."""
    links = find_symlinks(output_dir) if output_dir.is_dir() else []
    if links:
        shown = ", ".join(f"{p.relative_to(output_dir)} -> {os.readlink(p)}" for p in links)
        raise ValueError(f"{output_dir} holds symbolic links ({shown}): a run writes its folder's files in place, "
                         "so a link would send a write outside it; remove the links (or choose a new --output-dir)")


def _saved_kind(saved: dict[str, Any]) -> str | None:
    """The kind of run a saved config describes (None: unknown, e.g. an algorithm since removed)."""
    try:
        return run_kind(str(saved.get("recipe", "")), str(saved.get("algorithm_name", "")))
    except (ValueError, KeyError):
        return None


def _refuse_other_kind(cfg: RunConfig, saved: dict[str, Any], output_dir: Path) -> None:
    """Raise if the folder holds another kind of run: its phases are not this run's (a quick start's
    SFT then RL, one RL phase, one SFT phase...), so no config change can continue it."""
    kind = _saved_kind(saved)
    if kind is not None and kind != cfg.kind:
        raise ValueError(
            f"{output_dir} holds a {kind} run (recipe {saved.get('recipe')!r}), not a {cfg.kind} run like recipe "
            f"{cfg.recipe!r}: its checkpoints are of other phases, so --allow-config-change cannot continue it; "
            "choose a new --output-dir")


def check_run_folder(cfg: RunConfig, output_dir: Path) -> dict[str, tuple[Any, Any]]:
    """Raise (writing nothing) if `output_dir` cannot hold this run: it is a file, holds a symbolic
    link, another process writes it, or it holds a different run (see the module docstring for what
    may differ). Returns the changes accepted by `--allow-config-change` (empty: none)."""
    check_output_dir(output_dir)
    check_extras(cfg)
    check_no_symlinks(output_dir)
    holder = _busy(output_dir) if output_dir.is_dir() else None
    if holder is not None:
        _refuse_busy(output_dir, holder)
    saved_path = output_dir / "config.json"
    if not saved_path.is_file():
        return {}
    if not holds_a_run(output_dir):  # a failed start's config.json: no run to protect
        return {}
    try:
        saved = json.loads(saved_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{saved_path} cannot be read ({err}); pass a new --output-dir, or delete the "
                         "broken config.json if the folder's run is to be continued as configured now") from None
    try:  # fields added since the folder's run was written read as their defaults
        saved = to_dict(load_config(saved_path))
    except (ValueError, TypeError):  # a field since removed: compare the file as written
        pass
    new = to_dict(cfg)
    _refuse_other_kind(cfg, saved, output_dir)
    changes = {**config_changes(saved, new), **data_changes(cfg, output_dir)}
    if changes and not _ALLOW.get():
        listed = "; ".join(f"{k}: {old!r} -> {new_!r}" for k, (old, new_) in changes.items())
        raise ValueError(
            f"{output_dir} holds a run with a different config ({listed}). Only {', '.join(RESUMABLE)}* "
            "may change on resume. Rerun with the folder's settings (`--config "
            f"{saved_path}` repeats them), choose a new --output-dir, or pass --allow-config-change "
            "to continue this folder with the new config anyway")
    field, done = completed_steps(output_dir)
    budget = flatten(new).get(field, 0)
    if field and done > budget:
        raise ValueError(
            f"{field}={budget} is below the {done} steps {output_dir} already completed; a run folder keeps "
            f"describing the run it holds: set {field} >= {done} to resume (or finish) it, or choose a "
            "new --output-dir")
    return changes


def open_run_folder(cfg: RunConfig, output_dir: Path) -> None:
    """Check the folder against the run (`check_run_folder`), create it and write config.json.

    Replaces a plain write of config.json in every pipeline: call it after the inputs are checked
    and before anything else is written. It takes the folder's lock first (`lock_run_folder`;
    held until `release_run_folder` or the process's exit). config.json is written atomically.
    A change accepted by `--allow-config-change` is written only once the folder's checkpoint
    loaded into the new run's model (`start_run`): a change the checkpoint does not fit (another
    model shape) leaves config.json as it was, so the folder's own command still resumes it.
    """
    changes = check_run_folder(cfg, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    lock_run_folder(output_dir)
    if changes:
        _PENDING[output_dir.resolve()] = cfg
        logger.info("%s: continuing with a changed config (%s); config.json records it once the checkpoint "
                    "loads", output_dir, ", ".join(changes))
    else:
        write_config(cfg, output_dir)


def start_run(output_dir: Path, model: Any, trainer: TrainerConfig, **kwargs: Any) -> Run:
    """`Run.from_trainer` (it loads the folder's newest checkpoint into `model`), then config.json
    records a config change `open_run_folder` accepted: the checkpoint fits the changed run."""
    run = Run.from_trainer(output_dir, model, trainer, trust_legacy=_TRUST_LEGACY.get(), **kwargs)
    cfg = _PENDING.pop(output_dir.resolve(), None)
    if cfg is not None:
        write_config(cfg, output_dir)
    return run


@contextlib.contextmanager
def writing_run_folder(cfg: RunConfig, output_dir: Path) -> Iterator[None]:
    """`open_run_folder` for the block; the lock is released when it ends, also on an error."""
    open_run_folder(cfg, output_dir)
    try:
        yield
    finally:
        _PENDING.pop(output_dir.resolve(), None)
        release_run_folder(output_dir)


__all__ = ["DATA_STATE", "LOCK", "RESUMABLE", "check_run_folder", "config_change_allowed", "config_changes",
           "data_changes", "data_fingerprints", "holds_a_run", "legacy_checkpoints_trusted", "lock_run_folder",
           "open_run_folder", "release_run_folder", "start_run", "write_config", "writing_run_folder"]

"""A per-sandbox process and memory budget: one cgroup per run (v2, or v1's pids and memory).

Issue 38 S4/S5: rlimits count per process (``RLIMIT_AS``) or per uid across every sandbox
(``RLIMIT_NPROC``), so forked children held several times ``memory_mb`` and a fork bomb made
the program of a concurrent sandbox fail. Where a cgroup hierarchy with the ``pids`` and
``memory`` controllers is writable (root, or a delegated subtree), each run gets a cgroup
named after its host folder with ``pids.max = max_processes`` and a memory limit of
``memory_mb`` (swap off) for the program and everything it forks; the supervisor moves the
program into it before it drops privileges (:mod:`dllm_eval._supervisor`).

Where a cgroup is created: cgroup v2 beside the caller's own cgroup (v2 forbids processes in a
cgroup that hands controllers to children, so not under it) or under it when it already hands
out ``pids`` and ``memory``; cgroup v1 under the caller's own cgroup of each controller (the
caller's limits still bound the sandboxes). Elsewhere :func:`create` returns None and the
sandbox uses its fallback (:mod:`dllm_eval.sandbox`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "dllm-sandbox-"
_CONTROLLERS = ("pids", "memory")
_STALE_AFTER_S = 60.0
_warned = False
_lock = threading.Lock()


@dataclass(frozen=True)
class Budget:
    """The cgroup folders of one run (one for v2, one per controller for v1)."""

    version: int
    dirs: tuple[str, ...]

    @property
    def procs(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files the program's process writes ``0`` into to join."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self.dirs)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(root, mount point, fstype, super options)`` of each cgroup mount."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """The caller's cgroup per controller (``""`` for v2)."""
    paths = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _under(mount_root: str, mount_point: str, path: str) -> str | None:
    if path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
        return None
    return os.path.join(mount_point, path[len(mount_root):].lstrip("/")).rstrip("/")


def _hands_out(folder: str) -> bool:
    try:
        with open(os.path.join(folder, "cgroup.subtree_control"), encoding="utf-8") as f:
            enabled = set(f.read().split())
    except OSError:
        return False
    return all(c in enabled for c in _CONTROLLERS) and os.access(folder, os.W_OK)


def parents() -> tuple[int, tuple[str, ...]] | None:
    """``(version, folders)`` where per-run cgroups are made, or None where none can be: found
    once per process, and tried once with a throwaway cgroup and process."""
    with _lock:  # the sandbox's threads (execute_many) ask at once
        return _parents()


@functools.lru_cache(maxsize=1)
def _parents() -> tuple[int, tuple[str, ...]] | None:
    where = _find()
    if where is None or not _works(*where):
        return None
    return where


def _works(version: int, folders: tuple[str, ...]) -> bool:
    """Whether a cgroup can be made there, limited, and a process moved into it."""
    name = f"{PREFIX}probe-{os.getpid()}"
    made: list[str] = []
    child = subprocess.Popen([sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        made = _make(version, folders, name, 8, 64 << 20)
        for folder in made:
            _write(folder, "cgroup.procs", str(child.pid))
        return True
    except OSError as e:
        logger.info("cgroups unusable here (%s); the sandbox uses its fallback budget", e)
        return False
    finally:
        child.kill()
        child.wait()
        remove(Budget(version=version, dirs=tuple(made)), wait_s=2.0)


def _find() -> tuple[int, tuple[str, ...]] | None:
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return None
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            mine = _under(root, point, own[""])
            if mine is None:
                continue
            for folder in (os.path.dirname(mine), mine):
                if folder.startswith(point) and _hands_out(folder):
                    return 2, (folder,)
    v1 = []
    for controller in _CONTROLLERS:
        for root, point, fstype, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                mine_v1 = _under(root, point, own[controller])
                if mine_v1 is not None and os.access(mine_v1, os.W_OK):
                    v1.append(mine_v1)
                    break
    return (1, tuple(v1)) if len(v1) == len(_CONTROLLERS) else None


def _write(folder: str, name: str, value: str, required: bool = True) -> None:
    try:
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(value)
    except OSError:
        if required:
            raise


def _make(version: int, folders: tuple[str, ...], name: str, max_processes: int,
          memory_bytes: int) -> list[str]:
    """Make and limit the cgroups; on failure remove what was made and raise OSError."""
    made: list[str] = []
    try:
        for parent in folders:
            folder = os.path.join(parent, name)
            os.mkdir(folder, 0o755)
            made.append(folder)
            if version == 2 or parent == folders[0]:
                _write(folder, "pids.max", str(max_processes))
            if version == 2:
                _write(folder, "memory.max", str(memory_bytes))
                _write(folder, "memory.swap.max", "0", required=False)
                _write(folder, "memory.oom.group", "1", required=False)
            elif parent == folders[1]:
                _write(folder, "memory.limit_in_bytes", str(memory_bytes))
                _write(folder, "memory.memsw.limit_in_bytes", str(memory_bytes), required=False)
    except OSError:
        remove(Budget(version=version, dirs=tuple(made)), wait_s=1.0)
        raise
    return made


def create(name: str, max_processes: int, memory_bytes: int) -> Budget | None:
    """A cgroup ``name`` limited to ``max_processes`` tasks and ``memory_bytes`` (no swap).

    Returns:
        The :class:`Budget`, or None where no cgroup can be made (nothing is left behind).
    """
    global _warned
    where = parents()
    if where is None:
        return None
    try:
        return Budget(version=where[0], dirs=tuple(_make(*where, name, max_processes,
                                                         memory_bytes)))
    except OSError as e:
        if not _warned:
            _warned = True
            logger.warning("no cgroup for the sandbox (%s); using the fallback budget", e)
        return None


def _kill_members(folder: str) -> None:
    try:
        with open(os.path.join(folder, "cgroup.procs"), encoding="utf-8") as f:
            pids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def remove(budget: Budget, wait_s: float = 5.0) -> None:
    """Kill whatever is left in the cgroups and remove them (retrying while tasks exit)."""
    deadline = time.monotonic() + wait_s
    for folder in budget.dirs:
        while True:
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    logger.warning("could not remove the sandbox cgroup %s", folder)
                    break
                _kill_members(folder)
                time.sleep(0.02)


def sweep() -> list[str]:
    """Remove empty per-run cgroups older than a minute (left by a killed caller)."""
    where = parents()
    removed: list[str] = []
    if where is None:
        return removed
    for parent in where[1]:
        for folder in Path(parent).glob(PREFIX + "*"):
            try:
                if time.time() - folder.stat().st_mtime > _STALE_AFTER_S:
                    os.rmdir(folder)  # refused while any task is in it
                    removed.append(str(folder))
            except OSError:
                continue
    return removed

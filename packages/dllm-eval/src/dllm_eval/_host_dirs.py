"""Host temp folders of sandbox runs: each is owned through a lock held for the run's life.

A run's folder (``<tempdir>/dllm-sandbox-*``) holds ``_owner.lock``, locked (``flock``) by the
caller from before the supervisor starts until the folder is removed. The kernel drops the
lock when its holder dies however it dies, so a folder whose lock can be taken belongs to a
caller that was killed before it could clean up (issue 38 S3); :func:`sweep` removes those.
The lock file is locked under another name and then renamed into place, so a sweeper never
sees an unlocked ``_owner.lock`` of a live run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

PREFIX = "dllm-sandbox-"
OWNER_LOCK = "_owner.lock"
# a folder without a lock file is a run being set up (or one whose caller died in the few
# instructions between creating the folder and locking it): left alone for this long
_UNLOCKED_GRACE_S = 3600.0


def claim() -> tuple[Path, int]:
    """A new host temp folder and the fd of its held lock (close it after removing the folder)."""
    host_dir = Path(tempfile.mkdtemp(prefix=PREFIX))
    staging = host_dir / (OWNER_LOCK + ".new")
    fd = os.open(staging, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, host_dir / OWNER_LOCK)
    except BaseException:
        os.close(fd)
        shutil.rmtree(host_dir, ignore_errors=True)
        raise
    return host_dir, fd


def release(host_dir: Path, fd: int) -> None:
    """Remove a claimed folder, then drop its lock."""
    try:
        shutil.rmtree(host_dir, ignore_errors=True)
    finally:
        os.close(fd)


def _owner_is_dead(folder: Path) -> bool:
    try:
        fd = os.open(folder / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return time.time() - folder.stat().st_mtime > _UNLOCKED_GRACE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: the run is alive
    finally:
        os.close(fd)
    return True


def sweep(tmp: str | None = None) -> list[Path]:
    """Remove the folders of runs whose caller died; returns the folders removed."""
    removed = []
    for folder in Path(tmp or tempfile.gettempdir()).glob(PREFIX + "*"):
        if folder.is_dir() and not folder.is_symlink() and _owner_is_dead(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed

"""Writing a run folder's small files as untrusted ground: never through a symbolic link, and a
failed write (a full disk) as one error naming the file.

A run folder may come from elsewhere (copied, unpacked, shared), so a link planted in it
(`metrics.jsonl -> ~/.bashrc`) must not redirect a write outside it. Every file a run writes in
place is opened with `O_NOFOLLOW`; a temporary file is created anew (`O_EXCL`) after whatever had
its name is unlinked (which removes a link, not its target). `find_symlinks` lists the links of a
folder, for a caller that refuses such a folder before writing anything.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class FolderWriteError(OSError):
    """A run folder's file that could not be written (full disk, read-only...): one message naming
    the file, the free space and the fix; `filename` is the file."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.filename = str(path)

    def __str__(self) -> str:
        return str(self.args[0])


class SymlinkRefused(ValueError):
    """A file a run writes is a symbolic link (the message names it and the fix)."""


def _refuse_link(path: Path) -> SymlinkRefused:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return SymlinkRefused(f"{path} is a symbolic link (to {target}); a run folder's files are written in place, "
                          "so a link would send the write elsewhere: remove the link (or choose a new --output-dir)")


def _write_error(path: Path, err: OSError) -> FolderWriteError:
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**30:.1f} GiB free there"
    except OSError:
        free = "free space unknown"
    hint = ("free disk space (or pass --output-dir on a larger disk); the run resumes from its last checkpoint"
            if err.errno in (errno.ENOSPC, errno.EDQUOT) else "make the folder writable, or choose a new --output-dir")
    return FolderWriteError(path, f"could not write {path} ({err.strerror or err}); {free}: {hint}")


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """`os.open(path, flags | O_NOFOLLOW)`; a link at `path` raises `SymlinkRefused` naming it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.EMLINK and path.is_symlink()):
            raise _refuse_link(path) from None
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write(path: Path, text: str | bytes, flags: int, *, sync: bool) -> None:
    """Open `path` with `flags` without following a link and write `text` (str: UTF-8; or bytes), fsynced
    with `sync`; a failed write raises `FolderWriteError`."""
    try:
        fd = open_nofollow(path, flags)
        try:
            _write_all(fd, text.encode() if isinstance(text, str) else text)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except SymlinkRefused:
        raise
    except OSError as err:
        raise _write_error(path, err) from None


def append_text(path: Path, text: str) -> None:
    """Append `text` to `path` (created if absent) without following a link; a failed write raises
    `FolderWriteError` (one message: the file, the free space, the fix)."""
    _write(path, text, os.O_WRONLY | os.O_APPEND | os.O_CREAT, sync=False)


def write_new(path: Path, text: str | bytes) -> None:
    """Write `path` (text, or bytes as they are) as a new plain file (what had its name, a link included, is unlinked first),
    fsynced; a failed write raises `FolderWriteError`."""
    try:
        path.unlink(missing_ok=True)
    except OSError as err:
        raise _write_error(path, err) from None
    _write(path, text, os.O_WRONLY | os.O_CREAT | os.O_EXCL, sync=True)


def replace_text(path: Path, text: str | bytes) -> None:
    """Replace `path` atomically with `text` (or bytes): written to `<path>.tmp` (`write_new`), then renamed over
    it (a rename replaces a link at `path` itself, never its target)."""
    tmp = path.with_name(path.name + ".tmp")
    write_new(tmp, text)
    try:
        os.replace(tmp, path)
    except OSError as err:
        raise _write_error(path, err) from None


def find_symlinks(folder: Path, *, limit: int = 3) -> list[Path]:
    """Up to `limit` symbolic links inside `folder` (at any depth; links are not entered)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(root) / name
            if path.is_symlink():
                found.append(path)
                if len(found) >= limit:
                    return found
    return found


__all__ = ["FolderWriteError", "SymlinkRefused", "append_text", "find_symlinks", "open_nofollow", "replace_text",
           "write_new"]

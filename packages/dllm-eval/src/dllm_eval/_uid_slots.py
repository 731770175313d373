"""One uid per concurrent sandbox, the process budget's fallback where no cgroup can be made.

``RLIMIT_NPROC`` counts the processes of a uid across the machine: with one uid for every
sandbox, a fork bomb in one used up the count and the programs of concurrent sandboxes failed
to start (issue 38 S4). Without a cgroup (:mod:`dllm_eval._cgroups`) a sandbox run as root
takes a slot: the uid and gid ``UID_BASE + slot``, held through a ``flock`` on
``<tempdir>/dllm-uid-slots/<slot>.lock`` for the run's life, so no two live sandboxes share
a uid and ``RLIMIT_NPROC`` is each sandbox's own. The range sits above the ones container
runtimes and systemd hand out.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile

UID_BASE = 0x7FF00000
SLOTS = 4096
_FOLDER = "dllm-uid-slots"


def claim() -> tuple[int, int]:
    """``(uid, fd)``: a uid no other live sandbox holds and the fd of its lock (close to free)."""
    folder = os.path.join(tempfile.gettempdir(), _FOLDER)
    os.makedirs(folder, 0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeError(f"{folder} is not a folder of uid {os.geteuid()}; remove it")
    for slot in range(SLOTS):
        fd = os.open(os.path.join(folder, f"{slot}.lock"),
                     os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return UID_BASE + slot, fd
    raise RuntimeError(f"all {SLOTS} sandbox uid slots are held; run fewer sandboxes at once")

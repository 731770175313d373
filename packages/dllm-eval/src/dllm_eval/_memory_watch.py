"""The memory budget's fallback where no cgroup can be made: the harness polls the sandbox.

``RLIMIT_AS`` bounds each process, not their sum (forked children held several times
``memory_mb``; issue 38 S5). Without a cgroup (:mod:`dllm_eval._cgroups`) the harness sums
the anonymous resident memory (``statm`` resident minus shared pages, so the interpreter's
mapped files are not counted once per process) of the program's processes every
:data:`POLL_S` seconds and kills the sandbox when the sum passes ``memory_mb``. Between two
polls a burst can pass the budget by what the processes allocate in that time (each still
bounded by ``RLIMIT_AS``).
"""

from __future__ import annotations

import os

POLL_S = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids += [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        pass
    return kids


def _anon_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def program_bytes(supervisor: int, depth: int) -> int:
    """Anonymous resident bytes of the processes ``depth`` levels below ``supervisor`` and all
    their descendants (depth 1: the program; depth 2 with tests: the solution, not the runner)."""
    level = [supervisor]
    for _ in range(depth):
        level = [kid for pid in level for kid in _children(pid)]
    total, seen = 0, set()
    while level:
        pid = level.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _anon_bytes(pid)
        level += _children(pid)
    return total

"""Run untrusted Python programs in an isolated, resource-limited subprocess.

Each call starts ``python -I -S _supervisor.py`` in a new session. The supervisor (standard
library only) enters new mount/network/PID/IPC/UTS namespaces (plus a user namespace when not
root), mounts a private size-limited tmpfs as the program's working directory, applies rlimits,
drops to an unprivileged uid/gid when running as root, sets ``no_new_privs`` and forks the
program as PID 1 of its PID namespace. When PID 1 exits the kernel kills everything left in the
namespace, which also catches double-forked ``setsid`` escapees. The harness enforces a wall
clock, kills the supervisor's process group and the program's PID-namespace init, and removes
the host temp dir. Where the kernel refuses a namespace the run still happens, with fewer
protections, and :attr:`ExecutionResult.isolation` says which ones applied.

With ``completion_token=True`` a run only counts as passed when the program ran to its end: the
program is executed by a small harness (``harness.py``) that reads a per-run random token from a
file, deletes the file, runs ``solution.py`` and writes the token to stdout as the last line.
Exiting early (``sys.exit(0)``, ``os._exit(0)``, ``raise SystemExit``, an ``atexit`` hook, killing
the parent) leaves the token out, and the program never sees the token in its source, argv,
environment or stdin, so it cannot print it in advance.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["ExecutionResult", "SandboxLimits", "execute_code", "execute_many"]

logger = logging.getLogger(__name__)

_SUPERVISOR = str(Path(__file__).with_name("_supervisor.py"))
_NOBODY = 65534
_STARTUP_SLACK_S = 1.0
_TOKEN_FILE = ".token"
_HARNESS_FILE = "harness.py"
_HARNESS = """import os
import sys


def _run():
    with open(%(token)r, "rb") as f:
        token = f.read()
    os.unlink(%(token)r)
    with open("solution.py", encoding="utf-8") as f:
        code = compile(f.read(), "solution.py", "exec")
    exec(code, {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__})
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, b"\\n" + token + b"\\n")


_run()
""" % {"token": _TOKEN_FILE}


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """OS-level limits for one sandboxed execution.

    Args:
        timeout_s: wall-clock limit; the CPU limit is ``ceil(timeout_s) + 1`` seconds.
        memory_mb: address-space limit (RLIMIT_AS) per process.
        disk_mb: size of the private tmpfs and the largest file (RLIMIT_FSIZE).
        max_processes: RLIMIT_NPROC for the sandbox uid (shared by parallel runs as root).
        max_open_files: RLIMIT_NOFILE.
        max_output_bytes: stdout/stderr kept per stream (the rest is dropped).
        uid / gid: unprivileged identity used when the harness runs as root.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    disk_mb: int = 64
    max_processes: int = 256
    max_open_files: int = 256
    max_output_bytes: int = 1 << 20
    uid: int = _NOBODY
    gid: int = _NOBODY

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a positive finite number, got {self.timeout_s!r}")
        for name in ("memory_mb", "disk_mb", "max_processes", "max_open_files", "max_output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb={self.memory_mb} is too small for Python; use >= 64")
        if self.uid == 0 or self.gid == 0:
            raise ValueError("uid/gid must not be 0 (root); use an unprivileged id such as 65534")


@dataclass(frozen=True, kw_only=True)
class ExecutionResult:
    """Outcome of one sandboxed run.

    ``ok`` is True iff the program exited with status 0 within the limits (and, for runs with a
    completion token, printed the token as its last line; the token is removed from ``stdout``
    and ``completed`` says whether it was seen). ``returncode`` is
    the program's exit status, ``128 + signal`` when a signal killed it (e.g. 137 for SIGKILL,
    152 for SIGXCPU), or -9 when the harness killed it on the wall clock. ``isolation`` lists
    the protections that applied (e.g. ``netns``, ``pidns``, ``uid-drop``).
    """

    ok: bool
    timed_out: bool
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    isolation: tuple[str, ...]
    completed: bool | None = None


def _python_dirs() -> list[str]:
    exe = os.path.realpath(sys.executable)
    dirs = {sys.prefix, sys.base_prefix, os.path.dirname(exe), os.path.dirname(os.path.dirname(exe))}
    return sorted(os.path.realpath(d) for d in dirs)


def _scrubbed_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit)
    return data.decode("utf-8", errors="replace")


def _read_tail(path: Path, nbytes: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - nbytes))
        return f.read()


def _kill(pgid: int, pid: int | None) -> None:
    for fn, target in ((os.killpg, pgid), (os.kill, pid)):
        if target is None:
            continue
        try:
            fn(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_report(fd: int) -> dict[str, object]:
    os.set_blocking(fd, False)
    try:
        raw = os.read(fd, 65536)
    except BlockingIOError:
        raw = b""
    finally:
        os.close(fd)
    try:
        report = json.loads(raw.decode().splitlines()[0]) if raw else {}
    except (ValueError, IndexError):
        report = {}
    return report if isinstance(report, dict) else {}


def execute_code(
    source: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    stdin: str | None = None,
    limits: SandboxLimits | None = None,
    completion_token: bool = False,
) -> ExecutionResult:
    """Run a Python program in the sandbox and report how it ended.

    Args:
        source: the program text (written to ``solution.py`` in a private working directory).
        timeout_s: wall-clock limit (ignored when ``limits`` is given).
        memory_mb: address-space limit (ignored when ``limits`` is given).
        stdin: text fed to the program's standard input; empty when None.
        limits: full limit set; overrides ``timeout_s`` and ``memory_mb``.
        completion_token: pass only if the program runs to its end (see module docstring).

    Returns:
        An :class:`ExecutionResult`; hostile programs yield ``ok=False``, never an exception.
    """
    lim = limits if limits is not None else SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)
    start = time.monotonic()
    host_dir = Path(tempfile.mkdtemp(prefix="dllm-sandbox-"))
    try:
        (host_dir / "solution.py").write_text(source, encoding="utf-8")
        token = secrets.token_hex(16).encode() if completion_token else b""
        if completion_token:
            (host_dir / _TOKEN_FILE).write_bytes(token)
            (host_dir / _HARNESS_FILE).write_text(_HARNESS, encoding="utf-8")
        if stdin is not None:
            (host_dir / "stdin.txt").write_text(stdin, encoding="utf-8")
        out_path, err_path = host_dir / "_stdout", host_dir / "_stderr"
        read_fd, write_fd = os.pipe()
        cfg = {
            "host_dir": str(host_dir),
            "script": _HARNESS_FILE if completion_token else "solution.py",
            "python": sys.executable,
            "expose": _python_dirs(),
            "uid": lim.uid,
            "gid": lim.gid,
            "memory_mb": lim.memory_mb,
            "disk_mb": lim.disk_mb,
            "cpu_s": math.ceil(lim.timeout_s) + 1,
            "max_processes": lim.max_processes,
            "max_open_files": lim.max_open_files,
            "env": _scrubbed_env(),
            "report_fd": write_fd,
        }
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _SUPERVISOR, json.dumps(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=host_dir,
                env=_scrubbed_env(),
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        os.close(write_fd)
        timed_out = False
        try:
            returncode = proc.wait(timeout=lim.timeout_s + _STARTUP_SLACK_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        report = _read_report(read_fd)
        child = report.get("pid")
        _kill(proc.pid, child if isinstance(child, int) else None)
        if timed_out:
            proc.wait()
            returncode = -signal.SIGKILL
        isolation = report.get("isolation", [])
        stderr = _read_capped(err_path, lim.max_output_bytes)
        stdout = _read_capped(out_path, lim.max_output_bytes)
        cpu_killed = returncode == 128 + signal.SIGXCPU
        completed: bool | None = None
        if completion_token:
            suffix = b"\n" + token + b"\n"
            completed = _read_tail(out_path, len(suffix)) == suffix
            if completed:
                stdout = stdout.removesuffix(suffix.decode())
        return ExecutionResult(
            ok=returncode == 0 and not timed_out and completed is not False,
            timed_out=timed_out or cpu_killed,
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            wall_s=time.monotonic() - start,
            isolation=tuple(str(x) for x in isolation) if isinstance(isolation, list) else (),
            completed=completed,
        )
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def execute_many(
    sources: Sequence[str],
    *,
    max_workers: int | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    limits: SandboxLimits | None = None,
    completion_token: bool = False,
) -> list[ExecutionResult]:
    """Run many programs concurrently (thread pool of sandbox launches); order is preserved.

    Args:
        sources: program texts.
        max_workers: concurrent sandboxes; defaults to the number of CPUs.
        timeout_s / memory_mb / limits / completion_token: as in :func:`execute_code`.
    """
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1 or None, got {max_workers!r}")
    workers = max_workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(execute_code, s, timeout_s=timeout_s, memory_mb=memory_mb, limits=limits,
                        completion_token=completion_token)
            for s in sources
        ]
        return [f.result() for f in futures]

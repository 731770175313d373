"""Run untrusted Python programs in an isolated, resource-limited subprocess.

Each call starts ``python -I -S _supervisor.py`` in a new session. The supervisor (standard
library only) enters new mount/network/PID/IPC/UTS namespaces (plus a user namespace when not
root), pivots into a private root that holds only the system libraries, the interpreter's own
folders (read-only) and a size-limited tmpfs as the program's working directory, and forks the
program as PID 1 of its PID namespace with a fresh ``/proc``, rlimits, an unprivileged uid/gid
(when root) and ``no_new_privs``. When PID 1 exits the kernel kills everything left in the
namespace, which also catches double-forked ``setsid`` escapees. The harness enforces a wall
clock, kills the supervisor's process group and the program's PID-namespace init, and removes
the host temp dir. :attr:`ExecutionResult.isolation` says which protections applied.

The program and everything it forks share one budget of ``max_processes`` and ``memory_mb``:
a cgroup per run (:mod:`dllm_eval._cgroups`), or without one a uid per concurrent sandbox
(:mod:`dllm_eval._uid_slots`) and a memory watch (:mod:`dllm_eval._memory_watch`). The
supervisor and PID 1 die with the caller; the folders of killed callers are swept at the next
start (:mod:`dllm_eval._host_dirs`).

Isolation is required by default: where the kernel refuses the namespaces,
:class:`SandboxUnavailableError` is raised before any untrusted code runs. With
``SandboxLimits(isolation="best-effort")`` (or ``DLLM_SANDBOX_ISOLATION=best-effort``) the
program runs anyway with rlimits and, as root, the uid drop only, and a warning is logged.

:func:`execute_tests` decides success outside the program: the solution runs in one process,
the tests in another (a runner the solution can neither see, signal nor read, in a PID
namespace above the solution's), and every value crosses between them as plain data
(:mod:`dllm_eval._rpc`). Nothing the solution does (exiting early, forging output, patching
builtins, returning an object whose ``__eq__`` is always True) makes the runner's verdict pass.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from dllm_eval import _cgroups, _host_dirs, _memory_watch, _uid_slots

__all__ = [
    "ExecutionResult",
    "SandboxLimits",
    "SandboxUnavailableError",
    "execute_code",
    "execute_many",
    "execute_tests",
]

logger = logging.getLogger(__name__)

_SUPERVISOR = str(Path(__file__).with_name("_supervisor.py"))
_NOBODY = 65534
_STARTUP_SLACK_S = 1.0
_HERE = Path(__file__).parent
_EXIT_NO_ISOLATION = 125
_ISOLATION_MODES = ("required", "best-effort")
_ISOLATION_ENV = "DLLM_SANDBOX_ISOLATION"
_SERVE = """import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rpc import serve

serve(sys.argv[1], 3, 4)
"""
# test hook: extra unshare(2) flags; an invalid bit makes the kernel refuse, as some do
_EXTRA_UNSHARE_FLAGS = 0
_warned_unisolated = False
_SWEEP_EVERY_S = 60.0
# test hook: False takes the fallback budget (uid slots, rlimits) even where cgroups work
_USE_CGROUPS = True
_last_sweep: float | None = None


class SandboxUnavailableError(RuntimeError):
    """The kernel refused the namespaces the sandbox needs and isolation is required."""


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """OS-level limits for one sandboxed execution.

    Args:
        timeout_s: wall-clock limit; the CPU limit is ``ceil(timeout_s) + 1`` seconds.
        memory_mb: memory of the program and everything it forks together (a cgroup, or the
            harness's memory watch without one), and each process's address space (RLIMIT_AS).
        disk_mb: size of the private tmpfs and the largest file (RLIMIT_FSIZE).
        max_processes: tasks of the program and everything it forks together (a cgroup's
            ``pids.max``, or RLIMIT_NPROC of a uid the sandbox alone holds).
        max_open_files: RLIMIT_NOFILE.
        max_output_bytes: stdout/stderr kept per stream (the rest is dropped).
        uid / gid: unprivileged identity used when the harness runs as root and a cgroup
            holds the budget (without one, each concurrent sandbox gets a uid of its own:
            :mod:`dllm_eval._uid_slots`).
        isolation: ``"required"`` (raise :class:`SandboxUnavailableError` when namespaces
            are refused) or ``"best-effort"`` (run with rlimits and the uid drop only, logging
            a warning); None reads ``$DLLM_SANDBOX_ISOLATION``, default ``"required"``.
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    disk_mb: int = 64
    max_processes: int = 256
    max_open_files: int = 256
    max_output_bytes: int = 1 << 20
    uid: int = _NOBODY
    gid: int = _NOBODY
    isolation: str | None = None

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
        if self.isolation is not None and self.isolation not in _ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {_ISOLATION_MODES} or None, got "
                             f"{self.isolation!r}")


@dataclass(frozen=True, kw_only=True)
class ExecutionResult:
    """Outcome of one sandboxed run.

    ``ok`` is True iff the run ended with status 0 within the limits: for
    :func:`execute_code` the program's own exit status, for :func:`execute_tests` the test
    runner's verdict. ``returncode`` is that status, ``128 + signal`` when a signal killed it
    (e.g. 137 for SIGKILL, 152 for SIGXCPU), or -9 when the harness killed it on the wall
    clock. ``stdout``/``stderr`` are the program's (with tests, stderr also carries the
    runner's reason for a failure). ``isolation`` lists the protections that applied (e.g.
    ``netns``, ``private-root``, ``uid-drop``, ``split-tests``).
    """

    ok: bool
    timed_out: bool
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    isolation: tuple[str, ...]


def _python_paths() -> list[str]:
    """What the interpreter needs: ``bin``, ``lib*`` and ``pyvenv.cfg`` of each prefix."""
    paths = [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths += [os.path.join(prefix, name) for name in ("bin", "lib", "lib64", "pyvenv.cfg")]
    return sorted({p for p in paths if os.path.lexists(p)})


def _hidden_paths() -> list[str]:
    """This package (its data holds the benchmarks' tests), should it sit in site-packages."""
    return [str(_HERE.resolve())]


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


def _kill(pgid: int, pid: int | None) -> None:
    targets = [(os.killpg, pgid)] + ([] if pid is None else [(os.killpg, pid), (os.kill, pid)])
    for fn, target in targets:
        try:
            fn(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_report(fd: int) -> dict[str, object]:
    """Merge the JSON lines the supervisor and its child wrote (whatever arrived)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    report: dict[str, object] = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            report.update(item)
    return report


def _isolation_mode(lim: SandboxLimits) -> str:
    mode = lim.isolation or os.environ.get(_ISOLATION_ENV) or "required"
    if mode not in _ISOLATION_MODES:
        raise ValueError(f"{_ISOLATION_ENV}={mode!r} is not one of {_ISOLATION_MODES}")
    return mode


def _config(host_dir: Path, mode: str, lim: SandboxLimits, isolation_mode: str,
            report_fd: int, solution_names: tuple[str, ...], budget: _cgroups.Budget | None,
            uid: int | None) -> dict[str, object]:
    """The supervisor's configuration (one JSON argument)."""
    return {
        "host_dir": str(host_dir),
        "mode": mode,
        "script": "solution.py",
        "python": sys.executable,
        "expose": _python_paths(),
        "hide": _hidden_paths(),
        "harness": {"serve.py": _SERVE,
                    "_rpc.py": (_HERE / "_rpc.py").read_text(encoding="utf-8")},
        "isolation": isolation_mode,
        "extra_unshare_flags": _EXTRA_UNSHARE_FLAGS,
        "uid": lim.uid if uid is None else uid,
        "gid": lim.gid if uid is None else uid,
        "cgroup_procs": [] if budget is None else list(budget.procs),
        "memory_mb": lim.memory_mb,
        "disk_mb": lim.disk_mb,
        "cpu_s": math.ceil(lim.timeout_s) + 1,
        "max_processes": lim.max_processes,
        "max_open_files": lim.max_open_files,
        "env": _scrubbed_env(),
        "report_fd": report_fd,
        "parent_pid": os.getpid(),
        "solution_names": list(solution_names),
    }


def _run(files: dict[str, str], mode: str, lim: SandboxLimits,
         solution_names: tuple[str, ...] = ()) -> ExecutionResult:
    """Write ``files`` to a host temp dir, run the supervisor on them, collect the outcome."""
    isolation_mode = _isolation_mode(lim)
    start = time.monotonic()
    _sweep_now_and_then()
    host_dir, owner_lock = _host_dirs.claim()
    try:
        with _budget(host_dir, lim) as (budget, slot_uid):
            for name, text in files.items():
                (host_dir / name).write_text(text, encoding="utf-8")
            read_fd, write_fd = os.pipe()
            cfg = _config(host_dir, mode, lim, isolation_mode, write_fd, solution_names, budget,
                          slot_uid)
            with open(host_dir / "_stdout", "wb") as out, open(host_dir / "_stderr", "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _SUPERVISOR, json.dumps(cfg)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=host_dir,
                    env=_scrubbed_env(), start_new_session=True, pass_fds=(write_fd,),
                )
            os.close(write_fd)
            watch = None if budget else (2 if mode == "tests" else 1, lim.memory_mb << 20)
            returncode, stopped = _wait(proc, lim.timeout_s + _STARTUP_SLACK_S, watch)
            report = _read_report(read_fd)
            child = report.get("pid")
            _kill(proc.pid, child if isinstance(child, int) else None)
            if returncode is None:
                proc.wait()
                returncode = -signal.SIGKILL
        return _outcome(host_dir, lim, report, returncode, stopped, time.monotonic() - start)
    finally:
        _host_dirs.release(host_dir, owner_lock)


@contextlib.contextmanager
def _budget(host_dir: Path, lim: SandboxLimits) -> Iterator[tuple[_cgroups.Budget | None,
                                                                   int | None]]:
    """The run's process and memory budget: ``(cgroup, None)``, or without a cgroup (as root)
    ``(None, uid)`` with a uid no other live sandbox holds; released on exit."""
    budget = None
    if _USE_CGROUPS:
        budget = _cgroups.create(host_dir.name, lim.max_processes, lim.memory_mb << 20)
    slot_uid, slot_lock = (None, None)
    try:
        if budget is None and os.geteuid() == 0:
            slot_uid, slot_lock = _uid_slots.claim()
        yield budget, slot_uid
    finally:
        if budget is not None:
            _cgroups.remove(budget)
        if slot_lock is not None:
            os.close(slot_lock)


def _outcome(host_dir: Path, lim: SandboxLimits, report: dict[str, object], returncode: int,
             stopped: str | None, wall_s: float) -> ExecutionResult:
    """The :class:`ExecutionResult` of a finished run (or the error that isolation failed)."""
    global _warned_unisolated
    if "error" in report and returncode == _EXIT_NO_ISOLATION:
        raise SandboxUnavailableError(
            f"the sandbox cannot isolate programs here ({report['error']}); run as root or "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1"
            f" / user.max_user_namespaces > 0), or set {_ISOLATION_ENV}=best-effort (or "
            "SandboxLimits(isolation='best-effort')) to run untrusted code with rlimits "
            "and the uid drop only")
    isolation = report.get("isolation", [])
    tags = tuple(str(x) for x in isolation) if isinstance(isolation, list) else ()
    if "private-root" not in tags and not _warned_unisolated:
        _warned_unisolated = True
        logger.warning("sandbox ran without namespaces (isolation=best-effort): the program "
                       "can read host files and see host processes; applied: %s", tags)
    timed_out = stopped == "timeout"
    memory_note = (f"[dllm-eval] killed: the sandbox's processes held more than "
                   f"memory_mb={lim.memory_mb} together\n" if stopped == "memory" else "")
    return ExecutionResult(
        ok=returncode == 0 and not timed_out,
        timed_out=timed_out or returncode == 128 + signal.SIGXCPU,
        returncode=returncode,
        stdout=_read_capped(host_dir / "_stdout", lim.max_output_bytes),
        stderr=_read_capped(host_dir / "_stderr", lim.max_output_bytes) + memory_note,
        wall_s=wall_s,
        isolation=tags,
    )


def _wait(proc: subprocess.Popen[bytes], limit_s: float,
          watch: tuple[int, int] | None) -> tuple[int | None, str | None]:
    """The supervisor's exit status, or None and why it must be stopped (``"timeout"``, or
    ``"memory"`` when ``watch = (depth, bytes)`` is the fallback memory budget and the
    program's processes hold more: :mod:`dllm_eval._memory_watch`)."""
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            step = left if watch is None else min(left, _memory_watch.POLL_S)
            return proc.wait(timeout=step), None
        except subprocess.TimeoutExpired:
            if watch is not None and _memory_watch.program_bytes(proc.pid, watch[0]) > watch[1]:
                return None, "memory"
    return None, "timeout"


def _sweep_now_and_then() -> None:
    """Remove the host folders of runs whose caller was killed (at most once a minute)."""
    global _last_sweep
    now = time.monotonic()
    if _last_sweep is None or now - _last_sweep > _SWEEP_EVERY_S:
        _last_sweep = now
        _host_dirs.sweep()
        if _USE_CGROUPS:
            _cgroups.sweep()


def _limits(limits: SandboxLimits | None, timeout_s: float, memory_mb: int) -> SandboxLimits:
    return limits if limits is not None else SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb)


def execute_code(
    source: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    stdin: str | None = None,
    limits: SandboxLimits | None = None,
) -> ExecutionResult:
    """Run a Python program in the sandbox and report how it ended.

    ``ok`` is the program's own exit status, which the program controls: use it when the
    check happens outside (stdout compared with an expected output the program never sees);
    use :func:`execute_tests` when tests decide.

    Args:
        source: the program text (written to ``solution.py`` in a private working directory).
        timeout_s: wall-clock limit (ignored when ``limits`` is given).
        memory_mb: address-space limit (ignored when ``limits`` is given).
        stdin: text fed to the program's standard input; empty when None.
        limits: full limit set; overrides ``timeout_s`` and ``memory_mb``.

    Returns:
        An :class:`ExecutionResult`; hostile programs yield ``ok=False``, never an exception.

    Raises:
        SandboxUnavailableError: namespaces are refused and isolation is required.
    """
    files = {"solution.py": source} | ({} if stdin is None else {"stdin.txt": stdin})
    return _run(files, "program", _limits(limits, timeout_s, memory_mb))


def execute_tests(
    solution: str,
    tests: str,
    *,
    solution_names: Sequence[str] = (),
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    limits: SandboxLimits | None = None,
) -> ExecutionResult:
    """Run ``tests`` against ``solution``; pass iff every test statement ran without error.

    The solution runs as ``__main__`` in the sandbox. The tests run in a separate runner
    process; a name they use without defining it (the function under test, a helper or a
    class of the solution) resolves to the solution's global of that name, except builtin
    names (``sum``, ``sorted``, ``isinstance``, ...), which stay the runner's own unless
    listed in ``solution_names``: a solution cannot change how the tests compute an expected
    value. Calls
    cross as plain data: results arrive as exact builtin values (a subclass as its base value)
    and other objects as handles that cannot be compared. See :mod:`dllm_eval._rpc`.

    Args:
        solution: the candidate program (its top level runs once, before the tests).
        tests: trusted test code (assert statements, a ``check`` function and its call).
        solution_names: builtin names the tests take from the solution: the function under
            test where it is named like a builtin (MBPP's ``sum(10, 15) == 6``).
        timeout_s / memory_mb / limits: as in :func:`execute_code`; the limits apply to the
            solution's process and to the runner's each.

    Returns:
        An :class:`ExecutionResult` whose ``ok`` is the runner's verdict; the solution's
        stdout, and its stderr followed by the runner's reason for a failure.

    Raises:
        SandboxUnavailableError: namespaces are refused and isolation is required.
    """
    names = tuple(solution_names)
    for name in names:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"solution_names must be Python identifiers, got {name!r}; pass "
                             "the names of the solution's functions the tests call")
    files = {"solution.py": solution, "_tests.py": tests}
    return _run(files, "tests", _limits(limits, timeout_s, memory_mb), names)


def execute_many(
    sources: Sequence[str],
    *,
    max_workers: int | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    limits: SandboxLimits | None = None,
) -> list[ExecutionResult]:
    """Run many programs concurrently (thread pool of sandbox launches); order is preserved.

    Args:
        sources: program texts.
        max_workers: concurrent sandboxes; defaults to the number of CPUs.
        timeout_s / memory_mb / limits: as in :func:`execute_code`.
    """
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1 or None, got {max_workers!r}")
    workers = max_workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(execute_code, s, timeout_s=timeout_s, memory_mb=memory_mb, limits=limits)
            for s in sources
        ]
        return [f.result() for f in futures]

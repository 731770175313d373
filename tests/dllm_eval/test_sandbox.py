"""Hostile-program tests for the sandbox: each is contained, reported as failure, host unharmed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dllm_eval import _cgroups, _uid_slots
from dllm_eval import (
    ExecutionResult,
    SandboxLimits,
    SandboxUnavailableError,
    execute_code,
    execute_many,
    execute_tests,
)

IS_ROOT = os.geteuid() == 0


def _isolated() -> bool:
    return "netns" in execute_code("pass").isolation


def test_ok_program_captures_output() -> None:
    r = execute_code("import sys\nprint('hi')\nprint('err', file=sys.stderr)")
    assert isinstance(r, ExecutionResult)
    assert r.ok and r.returncode == 0 and not r.timed_out
    assert r.stdout == "hi\n" and r.stderr == "err\n"


def test_nonzero_exit_and_exception_are_failures() -> None:
    assert execute_code("raise SystemExit(3)").returncode == 3
    r = execute_code("assert 1 == 2")
    assert not r.ok and "AssertionError" in r.stderr


def test_stdin_is_fed() -> None:
    r = execute_code("print(input()[::-1])", stdin="abc\n")
    assert r.stdout == "cba\n"


def test_environment_is_scrubbed() -> None:
    os.environ["DLLM_EVAL_SECRET"] = "s3cret"
    try:
        r = execute_code("import os\nprint(sorted(os.environ))")
    finally:
        del os.environ["DLLM_EVAL_SECRET"]
    assert r.ok and "DLLM_EVAL_SECRET" not in r.stdout


def test_infinite_loop_is_killed() -> None:
    start = time.monotonic()
    r = execute_code("while True:\n    pass", timeout_s=1.0)
    assert not r.ok and r.timed_out
    assert time.monotonic() - start < 6


def test_memory_bomb_fails() -> None:
    r = execute_code("x = bytearray(3 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert not r.ok and "allocated" not in r.stdout


def test_write_outside_workdir_fails(tmp_path: Path) -> None:
    target = tmp_path / "escape.txt"
    r = execute_code(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok
    assert not target.exists()


def test_write_inside_workdir_is_allowed_and_discarded() -> None:
    r = execute_code("open('out.txt', 'w').write('x')\nimport os\nprint(os.path.abspath('out.txt'))")
    assert r.ok
    assert not Path(r.stdout.strip()).exists()  # private tmpfs (or removed temp dir)


def test_network_is_blocked() -> None:
    if not _isolated():
        pytest.skip("network namespaces unavailable here; see README sandbox limits")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        r = execute_code(
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "print('CONNECTED')"
        )
    assert not r.ok and "CONNECTED" not in r.stdout


def test_killing_parent_does_not_kill_harness() -> None:
    r = execute_code("import os, signal\nprint(os.getppid())\nos.kill(os.getppid(), signal.SIGKILL)"
                     "\nos.kill(0, 9)\nos.kill(-1, 9)")
    if "pidns" in r.isolation:
        assert r.stdout.split()[:1] == ["0"]  # the parent lies outside the program's namespace
    assert execute_code("print(1)").ok  # we are still alive


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop is only exercised as root")
def test_runs_unprivileged_when_root() -> None:
    r = execute_code("import os\nprint(os.getuid(), os.getgid(), os.getgroups())")
    uid, gid, groups = r.stdout.split(maxsplit=2)
    if "cgroup-budget" in r.isolation:  # SandboxLimits.uid
        assert r.ok and (uid, gid) == ("65534", "65534")
    else:  # a uid of its own per concurrent sandbox (test_sandbox_budget.py)
        assert r.ok and int(uid) >= _uid_slots.UID_BASE and gid == uid
    assert groups.strip() == "[]" and "uid-drop" in r.isolation


def _stray(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line]


def test_double_forked_setsid_child_is_killed() -> None:
    marker = "dllm_eval_escapee_marker"
    program = (
        "import os, time, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    r = execute_code(program, timeout_s=3)
    assert r.ok
    time.sleep(0.3)
    if "pidns" not in r.isolation:
        pytest.skip("no PID namespace: setsid escapees are not reaped (README)")
    assert _stray(marker) == []


def test_fork_bomb_is_contained() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    limits = SandboxLimits(timeout_s=1.5, max_processes=64, memory_mb=256)
    r = execute_code(bomb, limits=limits)
    assert not r.ok
    time.sleep(0.3)
    assert execute_code("print('alive')").ok


def test_execute_many_preserves_order() -> None:
    sources = [f"print({i} * {i})" for i in range(12)] + ["raise SystemExit(1)"]
    results = execute_many(sources, max_workers=4)
    assert [r.stdout.strip() for r in results[:12]] == [str(i * i) for i in range(12)]
    assert all(r.ok for r in results[:12]) and not results[12].ok


def test_limits_validation() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="uid"):
        SandboxLimits(uid=0)
    with pytest.raises(ValueError, match="max_workers"):
        execute_many(["pass"], max_workers=0)


def test_no_temp_dirs_left_behind() -> None:
    import tempfile

    before = {p.name for p in Path(tempfile.gettempdir()).glob("dllm-sandbox-*")}
    execute_code("print(1)")
    after = {p.name for p in Path(tempfile.gettempdir()).glob("dllm-sandbox-*")}
    assert after <= before


# Tests run apart from the solution: a run passes only if the test runner reaches its end.
EARLY_EXITS = {
    "sys.exit(0)": "import sys\nsys.exit(0)",
    "os._exit(0)": "import os\nos._exit(0)",
    "raise SystemExit": "raise SystemExit",
    "raise SystemExit(0)": "raise SystemExit(0)",
    "exit()": "exit()",
    "atexit os._exit(0)": "import atexit, os\natexit.register(lambda: os._exit(0))",
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "kill own group": "import os\nos.kill(0, 9)",
    "kill everything": "import os\nos.kill(-1, 9)",
    "close stdout": "import os\nos.close(1)",
    "close the pipes": "import os\nos.close(3)\nos.close(4)",
    "exit inside the call": "def f(x):\n    import os\n    os._exit(0)",
    "SystemExit inside the call": "def f(x):\n    raise SystemExit(0)",
}


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_early_exit_fails_the_tests(name: str) -> None:
    solution = "def f(x):\n    return x + 1\n" + EARLY_EXITS[name]
    r = execute_tests(solution, "assert f(1) == 3")  # f is wrong: only an escape could pass
    assert not r.ok, (name, r)


def test_tests_pass_and_fail_on_the_values() -> None:
    solution = "def f(x):\n    return x + 1\nprint('loaded')\n"
    r = execute_tests(solution, "assert f(1) == 2\nassert f(-1) == 0\n")
    assert r.ok and r.stdout == "loaded\n" and "split-tests" in r.isolation
    r = execute_tests(solution, "assert f(1) == 2\nassert f(2) == 4\n")
    assert not r.ok and "AssertionError" in r.stderr


def test_solution_errors_reach_the_tests() -> None:
    solution = "def f(x):\n    raise ValueError('bad ' + str(x))\n"
    tests = "try:\n    f(1)\nexcept ValueError as e:\n    assert str(e) == 'bad 1'\n"
    assert execute_tests(solution, tests).ok
    assert not execute_tests("raise ImportError('x')\ndef f(x):\n    return 1", "f(1)").ok


def test_solution_cannot_reach_the_tests() -> None:
    # the expected value exists only in the runner; a snooping solution finds nothing.
    # The marker is letters outside hex: a number like 4242 turns up by chance in the
    # 0x... addresses of the reprs the walk reads (it failed CI once that way).
    snoop = (
        "import gc, os\n"
        "def _look():\n"
        "    m = 'qz' + 'xw' * 2  # the marker, never spelled out in this source\n"
        "    if any(m in repr(o) for o in gc.get_objects() if isinstance(o, (dict, list))):\n"
        "        return True\n"
        "    return any(m in open(f, errors='replace').read()\n"
        "               for f in os.listdir('.') if os.path.isfile(f))\n"
        "found = _look()\n"
        "procs = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "def f():\n"
        "    return (found, procs)\n"
    )
    tests = "got = f()\nassert got == (False, ['1']), got\nassert 'qzxwxw' != ''\n"
    r = execute_tests(snoop, tests, timeout_s=20)  # the gc walk is slow on a loaded machine
    assert r.ok, (r.timed_out, r.stderr)


def _reachable_by_others(path: str) -> bool:
    parts = Path(os.path.realpath(path)).parents
    return all(os.stat(p).st_mode & 0o001 for p in parts)


# Where the kernel refuses namespaces: fail closed by default, run degraded only when asked.
# An invalid unshare(2) bit (CLONE_PTRACE) makes this kernel refuse the way others do.
@pytest.fixture
def kernel_refuses_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    from dllm_eval import sandbox

    monkeypatch.setattr(sandbox, "_EXTRA_UNSHARE_FLAGS", 0x00002000)
    monkeypatch.setattr(sandbox, "_warned_unisolated", False)
    monkeypatch.delenv("DLLM_SANDBOX_ISOLATION", raising=False)


@pytest.mark.usefixtures("kernel_refuses_namespaces")
def test_missing_isolation_fails_closed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(SandboxUnavailableError, match="DLLM_SANDBOX_ISOLATION=best-effort"):
        execute_code(f"open({str(marker)!r}, 'w').write('x')")
    with pytest.raises(SandboxUnavailableError):
        execute_tests("def f():\n    return 1\n", "assert f() == 1")
    assert not marker.exists()  # nothing ran


@pytest.mark.usefixtures("kernel_refuses_namespaces")
def test_best_effort_runs_degraded_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    limits = SandboxLimits(isolation="best-effort")
    with caplog.at_level("WARNING", logger="dllm_eval.sandbox"):
        r = execute_code("print('ran')", limits=limits)
    assert "private-root" not in r.isolation and "netns" not in r.isolation
    assert "without namespaces" in caplog.text
    if IS_ROOT and not _reachable_by_others(sys.executable):
        # without a mount namespace nothing can re-expose an interpreter under /root (0700)
        assert not r.ok and r.returncode == 127
        pytest.skip("the interpreter is not reachable by uid 65534 without namespaces")
    assert r.ok and r.stdout == "ran\n"
    monkeypatch.setenv("DLLM_SANDBOX_ISOLATION", "best-effort")
    assert execute_tests("def f(x):\n    return x * 2\n", "assert f(2) == 4").ok
    liar = "class L:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return L()\n"
    assert not execute_tests(liar, "assert f(2) == 4").ok  # the verdict is still the runner's
    with pytest.raises(ValueError, match="isolation"):
        SandboxLimits(isolation="off")


def test_the_interpreters_own_directories_stay_importable_under_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout (and its virtual environment) under /tmp: the runner keeps the interpreter's
    site-packages on sys.path (the tests import numpy), and drops the work dir and the rest of /tmp."""
    import sys

    from dllm_eval import _supervisor

    monkeypatch.setattr(sys, "prefix", "/tmp/checkout/.venv")
    assert _supervisor._importable("/tmp/checkout/.venv/lib/python3.11/site-packages", "/tmp")
    assert not _supervisor._importable("/tmp", "/tmp")
    assert not _supervisor._importable("/tmp/solution_dir", "/tmp")
    assert not _supervisor._importable("/tmp/checkout/packages/dllm-eval/src", "/tmp")
    assert not _supervisor._importable("", "/tmp")


# the sandbox without dllm_eval's __init__ (whose imports take long on a loaded machine)
SANDBOX_ONLY = ("import sys, types\npkg = types.ModuleType('dllm_eval')\npkg.__path__ = [sys.argv[1]]\n"
                "sys.modules['dllm_eval'] = pkg\nfrom dllm_eval.sandbox import execute_code\n")


def test_killing_the_caller_ends_the_sandbox_and_its_folder_is_swept() -> None:
    """Issue 38 S3: a SIGKILLed caller left the supervisor and the program running and the host
    temp folder behind. Now both die with it and the next sandbox start removes the folder."""
    import tempfile

    from dllm_eval import _host_dirs, sandbox

    marker = f"dllm_eval_orphan_marker_{os.getpid()}"
    program = ("import os, sys\n"
               f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n")
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob(_host_dirs.PREFIX + "*"))
    proc = subprocess.Popen([sys.executable, "-c", SANDBOX_ONLY + "execute_code(sys.stdin.read(), timeout_s=60)",
                             str(Path(sandbox.__file__).parent)], stdin=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write(program)  # not in the caller's command line, where ps would find it
    proc.stdin.close()
    deadline = time.monotonic() + 60
    while not _stray(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stray(marker), "the sandboxed program never started"
    (folder,) = set(tmp.glob(_host_dirs.PREFIX + "*")) - before
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while (_stray(marker) or _stray(folder.name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stray(marker) == [] and _stray(folder.name) == []  # program and supervisor
    assert folder.exists()  # nobody removed it yet
    where = _cgroups.parents()
    cgroups = [Path(parent, folder.name) for parent in where[1]] if where else []
    assert all(c.is_dir() for c in cgroups)  # the run's cgroups, empty now
    sandbox._last_sweep = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cgroups, "_STALE_AFTER_S", 0.0)
        assert execute_code("pass").ok
    assert not folder.exists()
    assert not any(c.exists() for c in cgroups)


def test_the_sweep_leaves_live_runs_alone(tmp_path: Path) -> None:
    from dllm_eval import _host_dirs

    live, fd = _host_dirs.claim()
    try:
        assert live not in _host_dirs.sweep()
        assert live.exists()
    finally:
        _host_dirs.release(live, fd)
    assert not live.exists()

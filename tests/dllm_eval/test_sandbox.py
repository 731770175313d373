"""Hostile-program tests for the sandbox: each is contained, reported as failure, host unharmed."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dllm_eval import ExecutionResult, SandboxLimits, execute_code, execute_many

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
    r = execute_code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(0, 9)")
    assert not r.ok
    assert execute_code("print(1)").ok  # we are still alive


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop is only exercised as root")
def test_runs_unprivileged_when_root() -> None:
    r = execute_code("import os\nprint(os.getuid(), os.getgid(), os.getgroups())")
    assert r.ok and r.stdout.split()[:2] == ["65534", "65534"]
    assert "uid-drop" in r.isolation


def _stray(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
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


# Completion token: a run passes only if the program reaches its end (the harness prints a
# per-run random token after the last statement; the program never sees the token).
EARLY_EXITS = {
    "sys.exit(0)": "import sys\nsys.exit(0)\nassert False",
    "os._exit(0)": "import os\nos._exit(0)\nassert False",
    "raise SystemExit": "raise SystemExit\nassert False",
    "raise SystemExit(0)": "raise SystemExit(0)\nassert False",
    "exit()": "exit()\nassert False",
    "atexit os._exit(0)": "import atexit, os\natexit.register(lambda: os._exit(0))\nassert False",
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nassert False",
    "kill own group": "import os\nos.kill(0, 9)\nassert False",
    "close stdout": "import os\nos.close(1)",
}


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_early_exit_fails_with_completion_token(name: str) -> None:
    r = execute_code(EARLY_EXITS[name], completion_token=True)
    assert not r.ok and r.completed is not True, (name, r)


def test_completion_token_is_required_and_stripped() -> None:
    r = execute_code("print('tests passed')", completion_token=True)
    assert r.ok and r.completed and r.stdout == "tests passed\n"
    # without the token the same early exit would have counted as a pass
    assert execute_code("import sys\nsys.exit(0)\nassert False").ok


def test_program_cannot_forge_the_token() -> None:
    # everything the program can see: its files, environment, argv, stdin; none holds the token
    snoop = (
        "import os, sys\n"
        "seen = [open(f, errors='replace').read() for f in os.listdir('.') if os.path.isfile(f)]\n"
        "seen += [repr(dict(os.environ)), repr(sys.argv), sys.stdin.read()]\n"
        "print('\\n'.join(seen))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    r = execute_code(snoop, completion_token=True, stdin="")
    assert not r.ok and r.completed is False  # had it found the token, this would be True
    # a guessed token of the right shape is still wrong
    guess = "import os\nos.write(1, b'\\n' + b'0' * 32 + b'\\n')\nos._exit(0)"
    assert not execute_code(guess, completion_token=True).ok

"""Per-sandbox process and memory budgets (issue 38 S4, S5), with a cgroup and without one.

``cgroup``: a cgroup per run (where this machine can make one; skipped elsewhere, with the
reason). ``fallback``: what a machine without writable cgroups gets (forced here by the
``_USE_CGROUPS`` test hook): a uid of its own per concurrent sandbox for ``RLIMIT_NPROC``
(as root) and the harness's memory watch.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from dllm_eval import SandboxLimits, _cgroups, _uid_slots, execute_code, execute_tests, sandbox

IS_ROOT = os.geteuid() == 0


@pytest.fixture(params=["cgroup", "fallback"])
def budget(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "cgroup" and _cgroups.parents() is None:
        pytest.skip("no writable cgroup hierarchy with pids and memory here")
    if request.param == "fallback" and not IS_ROOT:
        pytest.skip("the uid-per-sandbox fallback needs root; as a user each sandbox has a user "
                    "namespace of its own, whose RLIMIT_NPROC count is its own")
    monkeypatch.setattr(sandbox, "_USE_CGROUPS", request.param == "cgroup")
    yield request.param


def _tag(budget: str) -> str:
    return "cgroup-budget" if budget == "cgroup" else "uid-drop"


# every child holds its process slot; the parent keeps forking until the budget refuses
BOMB = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60)\n"
    "            os._exit(0)\n"
    "    except OSError:\n"
    "        time.sleep(0.01)\n"
)


def test_a_fork_bomb_does_not_fail_its_neighbours(budget: str) -> None:
    """S4: with one RLIMIT_NPROC count for every sandbox's uid, correct programs run beside a
    fork bomb failed (3/3, 2/3, 5/5 in the issue's runs)."""
    limits = SandboxLimits(timeout_s=14, max_processes=48, memory_mb=512)
    bomb: list[object] = []
    thread = threading.Thread(target=lambda: bomb.append(execute_code(BOMB, limits=limits)))
    thread.start()
    time.sleep(2.0)  # the bomb holds its whole budget by now
    try:
        neighbours = [execute_code(f"print({i} * 7)", limits=limits) for i in range(3)]
        tested = execute_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2", limits=limits)
        assert thread.is_alive(), "the bomb ended before its neighbours ran"
    finally:
        thread.join()
    assert [r.stdout for r in neighbours] == [f"{i * 7}\n" for i in range(3)], neighbours
    assert all(r.ok for r in neighbours) and tested.ok, (neighbours, tested)
    assert _tag(budget) in neighbours[0].isolation
    (result,) = bomb
    assert not result.ok  # type: ignore[attr-defined]


def test_each_concurrent_sandbox_has_its_own_uid_without_a_cgroup(budget: str) -> None:
    if budget != "fallback":
        pytest.skip("with a cgroup the sandbox keeps SandboxLimits.uid")
    program = "import os, time\nprint(os.getuid())\ntime.sleep(1.5)\n"
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(execute_code(program).stdout))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids = {int(x) for x in out}
    assert len(uids) == 3 and all(u >= _uid_slots.UID_BASE for u in uids), out


# four children each hold 300 MiB at once: 1.2 GiB against a 512 MiB budget
HOARD = (
    "import os, time\n"
    "pids = []\n"
    "for _ in range({n}):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        block = b'x' * (300 << 20)\n"
    "        time.sleep(2)\n"
    "        os._exit(0)\n"
    "    pids.append(pid)\n"
    "held = sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids)\n"
    "print('held', held)\n"
)


def test_memory_mb_bounds_the_sandbox_not_each_process(budget: str) -> None:
    """S5: RLIMIT_AS applied per process, so forked children held several times memory_mb."""
    limits = SandboxLimits(timeout_s=15, memory_mb=512)
    one = execute_code(HOARD.format(n=1), limits=limits)
    assert one.ok and one.stdout == "held 1\n", one  # one child within the budget is fine
    four = execute_code(HOARD.format(n=4), limits=limits)
    # at most one child holds its 300 MiB at a time (the cgroup's OOM killer, or the watch
    # ends the sandbox); before, all four held theirs at once
    assert "held 4" not in four.stdout and "held 3" not in four.stdout, four
    if budget == "fallback":
        assert "memory_mb=512 together" in four.stderr

"""The sandbox with the interpreter's environment under /tmp, as a CI clone's ``.venv`` can be.

Each test builds a virtual environment (the layout uv and ``python -m venv`` make: ``bin/python``
linked to the base interpreter, ``pyvenv.cfg``, ``lib/pythonX.Y/site-packages``) in a fresh
folder under ``/tmp`` and runs the sandbox from that interpreter in a subprocess, so the
sandbox exposes an environment whose folders lie inside the program's private ``/tmp``.
Issue 38 S1: the solution renamed a folder above the interpreter there and planted a module
the tests import; a wrong solution scored 1.0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import dllm_eval

from .test_sandbox import EARLY_EXITS
from .test_sandbox_forgery import FORGERIES, LIARS, SHADOWED_SUM

_SRC = str(Path(dllm_eval.__file__).resolve().parent)
_HELPER = "dllm_probe_helper"
# runs in the /tmp environment: imports dllm_eval's sandbox without the package's __init__
# (whose dependencies that environment does not have), runs each case, prints the verdicts
_DRIVER = """
import json, sys, types
pkg = types.ModuleType("dllm_eval")
pkg.__path__ = [sys.argv[1]]
sys.modules["dllm_eval"] = pkg
from dllm_eval import sandbox
cases = json.loads(sys.stdin.read())
out = []
for solution, tests in cases:
    r = sandbox.execute_tests(solution, tests, timeout_s=10)
    out.append([r.ok, list(r.isolation), r.stderr[-400:]])
print(json.dumps(out))
"""
# a wrong solution that moves the folders above the interpreter's site-packages aside (from the
# deepest one up) and plants the module the tests import, one that ends the runner with 0
_SHADOW = (
    "import os, sys\n"
    "for _p in [p for p in sys.path if p.startswith('/tmp/')]:\n"
    "    _parts = _p.split('/')\n"
    "    for _depth in range(len(_parts), 2, -1):\n"
    "        _folder = '/'.join(_parts[:_depth])\n"
    "        try:\n"
    "            os.rename(_folder, _folder + '.moved')\n"
    "            break\n"
    "        except OSError:\n"
    "            continue\n"
    "    try:\n"
    "        os.makedirs(_p, exist_ok=True)\n"
    f"        with open(_p + '/{_HELPER}.py', 'w') as _f:\n"
    "            _f.write('import os\\nos._exit(0)\\n')\n"
    "        print('planted', _p)\n"
    "    except OSError as _e:\n"
    "        print('refused', _p, _e)\n"
)
_TESTS = f"import {_HELPER}\nassert f(3) == {_HELPER}.double(3)\n"


@pytest.fixture(scope="module")
def tmp_env() -> Iterator[Path]:
    """A virtual environment under /tmp whose site-packages holds one small module."""
    root = Path(tempfile.mkdtemp(prefix="dllm-ci-clone-", dir="/tmp"))
    env = root / ".venv"
    base = os.path.realpath(sys.executable)
    version = sysconfig.get_python_version()
    site = env / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to(base)
    (env / "pyvenv.cfg").write_text(
        f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
    (site / f"{_HELPER}.py").write_text("def double(x):\n    return 2 * x\n")
    for path in (root, env, env / "lib", site.parent, site):  # readable by the sandbox's uid
        path.chmod(0o755)
    try:
        yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_in(env: Path, cases: list[tuple[str, str]]) -> list[tuple[bool, list[str], str]]:
    proc = subprocess.run([str(env / "bin" / "python"), "-I", "-c", _DRIVER, _SRC],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [tuple(x) for x in json.loads(proc.stdout)]  # type: ignore[misc]


def test_the_environment_is_under_tmp_and_works(tmp_env: Path) -> None:
    (ok, isolation, err), = _run_in(tmp_env, [("def f(x):\n    return 2 * x\n", _TESTS)])
    assert str(tmp_env).startswith("/tmp/")
    assert ok, err  # the tests import the environment's module inside the sandbox
    assert "private-root" in isolation


def test_a_planted_module_under_tmp_does_not_reach_the_tests(tmp_env: Path) -> None:
    wrong = "def f(x):\n    return 0\n" + _SHADOW
    right = "def f(x):\n    return 2 * x\n" + _SHADOW
    (wrong_ok, _, err), (right_ok, _, err2) = _run_in(tmp_env, [(wrong, _TESTS), (right, _TESTS)])
    assert not wrong_ok, err  # scored 1.0 before: the runner imported the planted module
    assert right_ok, err2


def test_hostile_solutions_fail_with_the_environment_under_tmp(tmp_env: Path) -> None:
    """The early exits, frame theft and always-equal objects of the other suites, run from the
    environment under /tmp; every solution is wrong, so each must fail."""
    wrong = "def f(x):\n    return x + 1\n"
    cases = [(wrong + EARLY_EXITS[name], "assert f(1) == 3") for name in sorted(EARLY_EXITS)]
    cases += [(wrong + FORGERIES[name], "assert f(1) == 3") for name in sorted(FORGERIES)]
    cases += [(LIARS[name].replace("{name}", "f"), "assert f(1) == 3") for name in sorted(LIARS)]
    cases.append((SHADOWED_SUM, "assert double_the_difference(list(range(20))) == "
                                "sum(x * x for x in range(20) if x % 2)"))
    results = _run_in(tmp_env, cases)
    assert [ok for ok, _, _ in results] == [False] * len(cases), results

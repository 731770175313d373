"""`dare recipes` and a misspelled recipe answer without importing torch (issue 39 row 10), and say what the
full CLI says; the committed index cannot drift from the registry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dare.recipe_index import load, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_index_is_the_registrys() -> None:
    assert load() == render(), "apps/dare/src/dare/recipes_index.json is stale: run `uv run python -m dare.recipe_index`"


def _dare(*args: str, full: bool = False) -> subprocess.CompletedProcess[str]:
    """The `dare` entry (as `uv run apps/dare` starts it, with `-X importtime`), or the full CLI."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    argv = ([sys.executable, "-c", "import sys; from dare.cli import main; sys.exit(main(sys.argv[1:]))"] if full
            else [sys.executable, "-X", "importtime", str(ROOT / "apps" / "dare")])
    return subprocess.run([*argv, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


def _split(stderr: str) -> tuple[str, list[str]]:
    """(stderr without the import-time lines, the modules imported)."""
    lines = stderr.splitlines(keepends=True)
    imported = [ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:")]
    return "".join(ln for ln in lines if not ln.startswith("import time:")), imported


@pytest.mark.parametrize("args", [("recipes",), ("train", "llada-d11"), ("show", "sdar-bgp")])
def test_cheap_answers_import_no_torch_and_equal_the_full_clis(args: tuple[str, ...]) -> None:
    fast, full = _dare(*args), _dare(*args, full=True)
    assert fast.returncode == full.returncode == (0 if args == ("recipes",) else 2)
    assert fast.stdout == full.stdout
    stderr, imported = _split(fast.stderr)
    assert stderr == full.stderr
    assert imported and "torch" not in imported  # before: `dare recipes` imported torch (3.8 s of its 4.3 s)
    if args != ("recipes",):
        assert "did you mean" in stderr


def test_a_known_recipe_and_other_commands_take_the_full_cli() -> None:
    from dare.entry import fast_answer

    assert fast_answer(["show", "llada-d1"]) is None
    assert fast_answer(["train", "rl.group_size=4"]) is None
    assert fast_answer(["runs"]) is None and fast_answer([]) is None

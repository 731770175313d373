"""The `dare` command's entry point: cheap answers first, then the full CLI (`dare.cli.main`).

`dare recipes` and `dare train|show <misspelled recipe>` are answered from `dare.recipe_index`
without importing torch, when no algorithm plugin is installed (their answers then equal the full
CLI's, which `tests/dare/test_recipe_index.py` checks); everything else goes to `dare.cli.main`.
"""

from __future__ import annotations

import sys


def _plugins_installed() -> bool:
    from importlib.metadata import entry_points

    return bool(list(entry_points(group="dare.algorithms")))


def fast_answer(argv: list[str]) -> int | None:
    """The exit code of a command answered from the index, or None for the full CLI."""
    words = [w for w in argv if w != "--no-progress"]
    if not words or words[0] not in ("recipes", "train", "show"):
        return None
    if words[0] == "recipes" and len(words) > 1:
        return None
    if words[0] != "recipes":
        if len(words) < 2 or words[1].startswith("-") or "=" in words[1]:
            return None
    from dare.recipe_index import load

    index = load()
    if index is None or _plugins_installed():
        return None
    names: list[str] = index["recipes"]
    if words[0] == "recipes":
        sys.stdout.write(index["listing"])
        return 0
    name = words[1]
    if name in names:
        return None  # a known recipe: the full CLI runs it
    from dare.config_tree import did_you_mean

    sys.stderr.write(f"dare: error: recipe {name!r} is unknown{did_you_mean(name, names)}; choose one of "
                     f"{sorted(names)} (see `dare recipes`)\n")
    return 2


def main() -> int:
    """`dare`: a cheap answer where there is one, else the full CLI."""
    code = fast_answer(sys.argv[1:])
    if code is not None:
        return code
    from dare.cli import main as full

    return full()


__all__ = ["fast_answer", "main"]

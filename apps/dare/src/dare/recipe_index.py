"""What `dare recipes` prints, and the recipe names, without importing torch (issue 39 row 10).

The recipes are built from the algorithm registry, whose entries are torch objects: listing them
the full way costs torch's import (about 4 s on a 2-core machine). `recipes_index.json` beside this
module holds the listing and the names; `dare.entry` answers `dare recipes` and a misspelled recipe
from it when no algorithm plugin is installed (a plugin's recipes exist only once it is imported),
and `tests/dare/test_recipe_index.py` fails when the file and the registry part. Rewrite it with
`python -m dare.recipe_index`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

INDEX = Path(__file__).with_name("recipes_index.json")


def render() -> dict[str, Any]:
    """The index from the live registry: {"recipes": names in `dare recipes` order, "listing": its text}."""
    import contextlib
    import io

    from dare.cli import list_recipes
    from dare.recipes import RECIPES

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        list_recipes()
    return {"recipes": list(RECIPES), "listing": out.getvalue()}


def load() -> dict[str, Any] | None:
    """The committed index, or None when it is missing or unreadable (the caller takes the full path)."""
    try:
        data = json.loads(INDEX.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "recipes" in data and "listing" in data else None


def write() -> None:
    """Rewrite `recipes_index.json` from the registry."""
    INDEX.write_text(json.dumps(render(), indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    write()
    print(f"wrote {INDEX}")


__all__ = ["INDEX", "load", "render", "write"]

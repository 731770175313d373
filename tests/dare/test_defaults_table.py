"""The one table of recipe defaults cannot drift: docs, the entries and the resolved recipes agree, and
each DARE row's transcribed line holds its value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dare.algorithms import RL_ENTRIES
from dare.algorithms.defaults_table import render, section
from dare.algorithms.entry import DARE_REPO, Default
from dare.recipes import RECIPES, get_recipe

ROOT = Path(__file__).resolve().parents[2]


def _get(cfg: object, key: str) -> object:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _numbers(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?", text)]


def _held(value: object, quote: str) -> bool:
    """Whether the transcribed line states `value` (numbers compared as numbers, lists item by item)."""
    if isinstance(value, tuple):
        return all(_held(v, quote) for v in value)
    if value is None:
        return "none" in quote.lower()
    if isinstance(value, bool) or isinstance(value, str):
        return str(value).lower() in quote.lower()
    assert isinstance(value, (int, float))
    return any(n == float(value) for n in _numbers(quote))


def test_docs_hold_the_rendered_table() -> None:
    assert section(ROOT / "docs" / "algorithms.md") == render(), (
        "docs/algorithms.md#dare-defaults is stale: run `uv run python -m dare.algorithms.defaults_table "
        "docs/algorithms.md`")


CASES = [(name, d) for name, e in RL_ENTRIES.items() for d in e.defaults]


@pytest.mark.parametrize("name, default", CASES, ids=[f"{n}:{d.key}:{','.join(d.families) or 'all'}"
                                                       for n, d in CASES])
def test_every_recipe_resolves_to_its_rows_value(name: str, default: Default) -> None:
    entry = RL_ENTRIES[name]
    families = default.families or entry.algorithm.families
    checked = 0
    for family in families:
        recipe = f"{family}-{name}"
        if recipe not in RECIPES:
            continue
        later = [d for d in entry.defaults if d.key == default.key and d.applies_to(family)]
        if later[-1] is not default:  # a later row of the same key wins for this family
            continue
        got = _get(get_recipe(recipe), default.key)
        want = default.value
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == want, (recipe, default.key, got, want)
        checked += 1
    assert checked or default.families, (name, default)


@pytest.mark.parametrize("name, default", [c for c in CASES if c[1].dare], ids=[
    f"{n}:{d.key}:{','.join(d.families) or 'all'}" for n, d in CASES if d.dare])
def test_every_dare_row_quotes_a_line_that_holds_its_value(name: str, default: Default) -> None:
    """The quoted line states the value, or (a rule DARE writes as code) the named test proves the equality."""
    if default.repo == DARE_REPO:
        assert default.dare.startswith(("recipe/", "verl/", "models/")), default.dare
    elif default.repo.startswith("Gen-Verse/dLLM-RL@"):  # TraceRL cites its authors' code (rl.py: their driver)
        assert default.dare.startswith(("configs/", "train/", "sample/", "reward/", "rl.py:")), (default.repo,
                                                                                               default.dare)
    if default.proof:
        path, _, test = default.proof.partition("::")
        assert f"def {test}(" in (ROOT / path).read_text(), default.proof
    else:
        assert _held(default.value, default.quote), (name, default.key, default.value, default.quote)


def test_the_quote_check_can_fail() -> None:
    assert not _held(0.6, "train_temperature=0.2") and _held(5e-7, "lr=5e-7") and _held(256, "x  # 512 / 2 = 256")
    assert not _held((0.9, 0.999), '+actor_rollout_ref.actor.optim.betas="[0.9,0.99]"')


def test_a_row_from_another_repository_names_it() -> None:
    from dare.algorithms.defaults_table import _source

    row = Default(key="rl.group_size", value=16, dare="configs/rl_sdar.yaml:12", quote="num_response_per_task: 16",
                  repo="Gen-Verse/dLLM-RL@10b4fd1")
    assert _source(row).startswith("Gen-Verse/dLLM-RL@10b4fd1 `configs/rl_sdar.yaml:12`")
    assert _source(Default(key="rl.group_size", value=8, dare="a.sh:1", quote="n=8")).startswith("`a.sh:1`")
    with pytest.raises(ValueError, match="repo='dLLM-RL' must be 'owner/name@commit'"):
        Default(key="rl.group_size", value=16, dare="a.sh:1", quote="16", repo="dLLM-RL")

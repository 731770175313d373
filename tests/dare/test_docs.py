"""Figures the README and docs state about the code are the code's: the quick-start model's
parameter count, the fields that may change on resume, the step budgets `dare show` describes, and
the README's Python example (run on a tiny config)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dare.quickstart import build_tiny_model
from dare.recipes import get_recipe
from dare.run_folder import RESUMABLE
from dare.show import describe_config
from dare.tasks.addition import build_tokenizer
from tests.dare.helpers import TINY

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_quickstart_parameter_count_is_the_models() -> None:
    model = build_tiny_model(get_recipe("quickstart"), build_tokenizer())
    count = f"{sum(p.numel() for p in model.parameters()):,}"
    for doc in ("docs/quickstart.md", "docs/benchmarks.md"):
        text = (ROOT / doc).read_text()
        assert f"{count} parameters" in text, doc
        assert "0.6 M" not in text, doc


def test_resume_field_list_is_the_codes() -> None:
    sentence = re.search(r"Only (.*?) may change on resume", README, re.S)
    assert sentence is not None
    listed = {name.rstrip("*") for name in re.findall(r"`([^`]+)`", sentence.group(1))}
    assert listed == set(RESUMABLE)


def test_dare_show_names_each_kinds_step_budget() -> None:
    def doc(recipe: str, key: str) -> str:
        return next(line for line in describe_config(get_recipe(recipe)).splitlines()
                    if line.strip().startswith(f"{key} ="))

    assert "RL phase" not in doc("llada-sft", "trainer.max_steps")
    assert "not used by SFT recipes" in doc("llada-sft", "trainer.max_steps")
    assert "SFT phase" in doc("llada-sft", "sft.steps")
    assert "preference phase" in doc("llada-vrpo", "trainer.max_steps")
    assert "RL phase" in doc("llada-d1", "trainer.max_steps")


def test_readme_python_example_runs(tmp_path: Path, capsys: object) -> None:
    block = re.search(r"<!-- python-example[^>]*-->\n```python\n(.*?)```", README, re.S)
    assert block is not None
    code = block.group(1)
    overrides = '["trainer.max_steps=20", "trainer.eval_every=10"]'
    assert overrides in code and '"runs/from-python"' in code  # the test edits only these two
    code = code.replace(overrides, repr(TINY)).replace('"runs/from-python"', repr(str(tmp_path / "run")))
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rl_steps"] == 4 and namespace["summary"]["eval_accuracy_after_rl"] == summary[  # type: ignore[index]
        "eval_accuracy_after_rl"]


def test_benchmarks_open_with_a_summary_and_contents_whose_links_resolve() -> None:
    # before: 2,205 lines of dated logs with no contents and no summary of the current figures
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    headings, fenced = [], False
    for line in text.splitlines():
        fenced = fenced != line.startswith("```")
        if not fenced and (m := re.match(r"#{2,3} (.*)", line)):
            headings.append(m.group(1))
    assert headings[:3] == ["Current summary (2026-12-03)", "Contents", "Training step of dllm-models (the first log)"]
    slugs: set[str] = set()
    for heading in headings:  # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        slugs.add(slug if slug not in slugs else f"{slug}-1")
    slugs |= set(re.findall(r'<a id="([\w-]+)"></a>', text))  # explicit anchors
    links = re.findall(r"\]\(#([\w-]+)\)", text)
    summary = text.split("## Contents")[0]
    assert len(re.findall(r"\]\(#", summary)) >= 12  # each summary row links its section
    assert links and not [a for a in links if a not in slugs]
    assert len(set(links)) >= len(headings) - 2  # the contents list every section

"""Architecture guards: one-way dependencies, no algorithm names below the app, model constants
only in dllm_models."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = {
    "dllm_objectives": ROOT / "packages/dllm-objectives/src/dllm_objectives",
    "dllm_models": ROOT / "packages/dllm-models/src/dllm_models",
    "dllm_rollout": ROOT / "packages/dllm-rollout/src/dllm_rollout",
    "dllm_eval": ROOT / "packages/dllm-eval/src/dllm_eval",
    "dllm_train": ROOT / "packages/dllm-train/src/dllm_train",
    "dllm_algorithms": ROOT / "packages/dllm-algorithms/src/dllm_algorithms",
    "dare": ROOT / "apps/dare/src/dare",
}
ALLOWED = {
    "dllm_objectives": set(),
    "dllm_models": set(),
    "dllm_rollout": {"dllm_models"},
    "dllm_eval": {"dllm_models", "dllm_rollout"},
    "dllm_train": {"dllm_objectives", "dllm_models", "dllm_rollout", "dllm_eval"},
    "dllm_algorithms": {"dllm_objectives", "dllm_models", "dllm_rollout", "dllm_train"},
    "dare": {"dllm_objectives", "dllm_models", "dllm_rollout", "dllm_eval", "dllm_train", "dllm_algorithms"},
}
ALGORITHM_NAMES = re.compile(
    r"\b(d1|diffu-?grpo|coupled[-_ ]?grpo|cj[-_]?grpo|spg|bgpo|ebpo|espo|mdpo|dmpo|vrpo|"
    r"d[-_]?treerpo|justgrpo|wdce|wddo)\b",
    re.IGNORECASE,
)
MODEL_CONSTANTS = re.compile(r"\b(126336|126081|126348|126080|151666|151669|151643|151645|156895|156892)\b")


def _sources(member: str) -> list[Path]:
    return sorted(MEMBERS[member].rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_dependencies_point_one_way(member: str) -> None:
    others = set(MEMBERS) - {member}
    bad = {
        str(p.relative_to(ROOT)): sorted((_imports(p) & others) - ALLOWED[member])
        for p in _sources(member)
    }
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("member", ["dllm_models", "dllm_rollout", "dllm_train"])
def test_no_algorithm_names_below_the_app(member: str) -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in _sources(member)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ALGORITHM_NAMES.search(line)
    ]
    assert hits == []


@pytest.mark.parametrize("member", sorted(set(MEMBERS) - {"dllm_models"}))
def test_model_constants_live_only_in_dllm_models(member: str) -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in _sources(member)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if MODEL_CONSTANTS.search(line)
    ]
    assert hits == []


@pytest.mark.parametrize("member", ["dllm_train", "dllm_algorithms", "dare"])
def test_no_string_keyed_side_channels_between_algorithms_and_workers(member: str) -> None:
    """Algorithms and workers exchange named fields only: no `extras` dicts, no `dict[str, Any]`
    fields on the dataclasses that travel between them."""
    hits = []
    for p in _sources(member):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "extras":
                hits.append(f"{p.relative_to(ROOT)}:{node.lineno}: .extras")
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, (ast.Name, ast.Call, ast.Attribute)) and "dataclass" in ast.unparse(d)
                    for d in node.decorator_list):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and re.fullmatch(r"dict\[str, *Any\]", ast.unparse(item.annotation)):
                        hits.append(f"{p.relative_to(ROOT)}:{item.lineno}: {node.name}.{ast.unparse(item.target)}")
    assert hits == []


def test_objectives_depends_on_torch_only() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "packages/dllm-objectives/pyproject.toml").read_text())["project"]["dependencies"]
    assert [re.split(r"[<>=!~ ;\[]", d)[0].lower() for d in deps] == ["torch"]

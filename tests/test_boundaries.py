"""Architecture guards: one-way dependencies, no import cycles inside a member, no algorithm names
below the app, model constants only in dllm_models."""

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


def _module_names(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of a package folder (a package is its `__init__`)."""
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _internal_imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The member's modules that `name` imports -> line of the first such import.

    Counts every import: module-level, function-local and under `if TYPE_CHECKING:` (a local or
    typing-only import that dodges a cycle at run time still makes one between the concepts).
    `from pkg import x` names the module `pkg.x` when there is one, else `pkg` itself.
    """
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            if t in modules and t != name:
                found.setdefault(t, node.lineno)
    return found


def _import_cycles(package: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module in the import graph of a package folder."""
    modules = _module_names(package)
    graph = {m: _internal_imports(m, p, modules) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append([f"{a} -> {b} (line {graph[a][b]})" for a in sorted(group)
                               for b in sorted(graph[a]) if b in group])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_no_import_cycles_inside_a_member(member: str) -> None:
    """Modules of a member import each other one way: what one module needs from another that
    imports it back moves to a third module both import (as `response_mask` moved to batch.py, the
    mask spec to `dllm_models.mask`, `Prepared` beside `RLBatch`, the passes' scorer to a protocol).
    Imports inside functions and under `if TYPE_CHECKING:` count."""
    assert _import_cycles(MEMBERS[member]) == []


@pytest.mark.parametrize("hidden", [
    "def late():\n    from pkg import a\n",  # a function-level import
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n",  # typing only
])
def test_a_hidden_import_that_closes_a_circle_is_found(tmp_path: Path, hidden: str) -> None:
    """The cycle check sees the imports that dodge a circle at run time: `pkg.a` imports `pkg.b` at
    the top, `pkg.b` imports `pkg.a` back inside a function or under TYPE_CHECKING."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import other\nthing = 1\n")
    (pkg / "b.py").write_text(hidden + "other = 2\n")
    cycles = _import_cycles(pkg)
    assert len(cycles) == 1 and sorted(e.split(" (")[0] for e in cycles[0]) == ["pkg.a -> pkg.b", "pkg.b -> pkg.a"]
    (pkg / "b.py").write_text("other = 2\n")
    assert _import_cycles(pkg) == []


ENVIRONMENT_READERS = {
    "dllm-models/src/dllm_models/kernels/logsumexp.py":
        "TRITON_INTERPRET, Triton's own switch: the kernels run on the CPU in its interpreter (tests)",
    "dllm-train/src/dllm_train/distributed/fsdp.py":
        "distributed launch variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) that torch.distributed reads",
    "dllm-train/src/dllm_train/metrics.py":
        "wandb's own credentials and mode (WANDB_API_KEY, WANDB_MODE): offline logging without them",
    "dllm-eval/src/dllm_eval/opencompass/driver.py":
        "OpenCompass paths: where its separate uv project lives, and the child process's environment",
    "dllm-eval/src/dllm_eval/opencompass/run.py":
        "inside the OpenCompass process: offline switches for libraries that read them late",
    "dllm-eval/src/dllm_eval/sandbox.py":
        "the sandbox policy DLLM_SANDBOX_ISOLATION (a security policy of the host, not a setting of the run; "
        "SandboxLimits.isolation overrides it)",
}
"""The library files allowed to touch `os.environ` / `os.getenv`, each with its reason. Settings of a run
are typed config fields (`KernelConfig`, `SamplingConfig.speed`, ...), never environment variables."""


def _environment_lines(path: Path) -> list[int]:
    """Lines of `path` that read or write the process environment (`os.environ`, `os.getenv`, `environ[...]`)."""
    tree = ast.parse(path.read_text())
    return sorted({node.lineno for node in ast.walk(tree)
                   if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb"))
                   or (isinstance(node, ast.Name) and node.id in ("environ", "getenv"))})


def test_libraries_read_no_environment_variables_outside_the_allowlist() -> None:
    """No library reads a setting from the environment: every file of packages/*/src that touches it is in
    `ENVIRONMENT_READERS` with its reason, and every entry there still needs to be (no stale allowance)."""
    readers = {str(p.relative_to(ROOT / "packages")): _environment_lines(p)
               for p in sorted((ROOT / "packages").glob("*/src/**/*.py"))}
    readers = {k: v for k, v in readers.items() if v}
    assert {k: v for k, v in readers.items() if k not in ENVIRONMENT_READERS} == {}
    assert sorted(set(ENVIRONMENT_READERS) - set(readers)) == []


def test_the_environment_check_sees_every_spelling(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    for code in ("import os\nx = os.environ.get('DLLM_X')\n", "import os\nx = os.getenv('DLLM_X')\n",
                 "from os import environ\nx = environ['DLLM_X']\n", "from os import getenv\nx = getenv('A')\n"):
        src.write_text(code)
        assert _environment_lines(src) != [], code
    src.write_text("x = 'environment'\n")
    assert _environment_lines(src) == []


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

"""A new RL algorithm without editing DARE: `register(entry)` in process, and a user's package through the
`dare.algorithms` entry-point group (the worked example of docs/algorithms.md#new-algorithm)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dare.algorithms import ALGORITHMS, PAPERS, RL_ENTRIES, Default, RLEntry, register
from dare.recipes import RECIPE_DOCS, RECIPES, get_recipe, resolve
from dllm_algorithms import D1
from tests.dare.helpers import TINY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "dare_drgrpo"


@pytest.fixture
def registered() -> Iterator[RLEntry]:
    entry = RLEntry(name="my-d1", algorithm=D1(prompt_mask_prob=0.3), paper="a test", defaults=(
        Default(key="rl.group_size", value=4, reason="a test value"),
        Default(key="rollout.temperature", value=0.9, families=("dream",), reason="a test value"),
    ))
    register(entry)
    yield entry
    for table in (RL_ENTRIES, ALGORITHMS, PAPERS):
        table.pop("my-d1")  # type: ignore[attr-defined]


def test_a_registered_algorithm_gets_recipes_with_its_own_defaults(registered: RLEntry) -> None:
    assert {"llada-my-d1", "dream-my-d1"} <= set(RECIPES) and "sdar-my-d1" not in RECIPES
    assert RECIPE_DOCS["llada-my-d1"].startswith("LLaDA (masked diffusion), RL: ")
    llada, dream = get_recipe("llada-my-d1"), get_recipe("dream-my-d1")
    assert llada.rl.group_size == dream.rl.group_size == 4  # type: ignore[attr-defined]
    assert llada.rollout.temperature == 0.6 and dream.rollout.temperature == 0.9  # the family filter
    assert llada.algorithm == D1(prompt_mask_prob=0.3)
    # algorithm= switches to it, and task= reaches it (no task_overrides: one setting for every task)
    switched = resolve(get_recipe("llada-d1"), ["algorithm=my-d1", "task=code"])
    assert switched.algorithm_name == "my-d1" and switched.algorithm == D1(prompt_mask_prob=0.3)


def test_register_refuses_a_taken_name_and_a_non_algorithm(registered: RLEntry) -> None:
    with pytest.raises(ValueError, match="'my-d1' is already registered"):
        register(registered)
    with pytest.raises(ValueError, match="'dpo' is already registered"):
        register(RLEntry(name="dpo", algorithm=D1(), paper="x"))
    with pytest.raises(TypeError, match="does not implement dllm_train.RLAlgorithm"):
        RLEntry(name="x", algorithm=object(), paper="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one of dare="):
        Default(key="rl.group_size", value=4)
    with pytest.raises(ValueError, match="names families \\['sdar'\\]"):
        RLEntry(name="y", algorithm=D1(), paper="x", defaults=(Default(key="rl.group_size", value=4, reason="r",
                                                                     families=("sdar",)),))


def _install(site: Path, *, module: str = "dare_drgrpo", value: str = "dare_drgrpo:ENTRY") -> None:
    """The example package as an installer leaves it: its module and a dist-info naming the entry point."""
    shutil.copytree(EXAMPLE / "src" / "dare_drgrpo", site / module)
    info = site / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[dare.algorithms]\ndr-d1 = {value}\n")


def _dare(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "apps" / "dare"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env=env)


def test_a_user_package_adds_an_algorithm_that_dare_train_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site)
    listed = _dare(site, "recipes")
    assert listed.returncode == 0, listed.stderr
    assert "llada-dr-d1" in listed.stdout and "Liu et al., arXiv 2503.20783" in listed.stdout
    run = tmp_path / "run"
    out = _dare(site, "train", *TINY, "algorithm=dr-d1", "trainer.max_steps=2", "--output-dir", str(run),
                "--no-progress")
    assert out.returncode == 0, out.stderr
    config = json.loads((run / "config.json").read_text())
    assert config["algorithm_name"] == "dr-d1"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]


def test_the_example_algorithm_is_dr_grpo() -> None:
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        from dare_drgrpo import ENTRY, DrD1
    finally:
        sys.path.remove(str(EXAMPLE / "src"))
    scores, groups = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.25, so 0.75 and -0.25 (GRPO would divide by the std 0.5); group 1: all equal, 0
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0])
    assert torch.allclose(DrD1().advantages(scores, groups), expected)
    assert ENTRY.name == "dr-d1" and isinstance(ENTRY.algorithm, DrD1)


def test_a_broken_plugin_is_one_error_naming_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site, value="dare_drgrpo:MISSING")
    out = _dare(site, "recipes")
    assert out.returncode != 0
    assert "the algorithm plugin 'dr-d1' (dare_drgrpo:MISSING" in out.stderr

"""The Ray rank stack's call surface: rank methods are named by reference, never by a string.

`RayActorGroup.call(RankWorker.m, ...)` sends `m`'s name to every rank only after checking that it
is a `RankWorker` method; mypy checks the name, the arguments and the result at the call site.
No Ray cluster starts here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dllm_train import PolicyRank
from dllm_train.distributed import RankWorker
from dllm_train.distributed.ray_backend import method_name


def test_a_rank_method_is_sent_by_its_own_name() -> None:
    for method in (RankWorker.rollout_step, RankWorker.update, RankWorker.full_weights, RankWorker.save_shards):
        assert method_name(method) == method.__name__
        assert getattr(RankWorker, method_name(method)) is method


def test_a_function_that_is_not_a_rank_method_is_refused_before_anything_is_sent() -> None:
    # the same name on another class (the rank's PolicyRank) is not the surface a Ray rank runs
    with pytest.raises(TypeError, match="not a method of RankWorker"):
        method_name(PolicyRank.update)
    with pytest.raises(TypeError, match="not a method of RankWorker"):
        method_name(lambda worker: None)


@pytest.mark.slow
def test_mypy_rejects_a_misnamed_method_wrong_arguments_and_a_wrong_result(tmp_path: Path) -> None:
    from mypy import api

    snippet = tmp_path / "calls.py"
    snippet.write_text(
        "from dllm_train.distributed import RankWorker, RayActorGroup\n"
        "\n"
        "def ok(group: RayActorGroup) -> None:\n"
        "    weights = group.call(RankWorker.full_weights)[0]\n"
        "    group.call(RankWorker.save_shards, 'folder')\n"
        "    group.call_each(RankWorker.load_weights, [(weights,), ({},)])\n"
        "\n"
        "def bad(group: RayActorGroup) -> None:\n"
        "    group.call(RankWorker.full_weight)\n"  # renamed method
        "    group.call(RankWorker.save_shards, 3)\n"  # wrong argument type
        "    counts: list[int] = group.call(RankWorker.state)\n"  # wrong result type
    )
    out, _, status = api.run(["--strict", "--no-error-summary", str(snippet)])
    errors = sorted(int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line)
    assert status == 1
    assert errors == [9, 10, 11], out

"""The data-parallel x sequence-parallel rank grid and the configs that choose it."""

from __future__ import annotations

from typing import Any

import pytest

from dllm_train import RLConfig, TrainerConfig
from dllm_train.distributed import DistributedConfig, ParallelDims, RayRLWorkflow


def test_ranks_are_laid_out_sequence_parallel_fastest() -> None:
    dims = ParallelDims(world_size=6, sequence_parallel=3)
    assert dims.data_parallel == 2
    assert [dims.dp_rank(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert [dims.sp_rank(r) for r in range(6)] == [0, 1, 2, 0, 1, 2]
    assert dims.sp_ranks(1) == [3, 4, 5]
    assert ParallelDims(world_size=4).data_parallel == 4  # no sequence parallelism


@pytest.mark.parametrize("size", [0, 3])
def test_sequence_parallel_size_must_divide_the_ranks(size: int) -> None:
    with pytest.raises(ValueError, match=rf"sequence_parallel={size} must be >= 1 and divide .*\[1, 2, 4\]"):
        ParallelDims(world_size=4, sequence_parallel=size)
    with pytest.raises(ValueError, match=rf"trainer.sequence_parallel={size} .*trainer.num_workers=4"):
        TrainerConfig(backend="ray", num_workers=4, sequence_parallel=size)
    with pytest.raises(ValueError, match=rf"distributed.sequence_parallel={size}"):
        DistributedConfig(num_workers=4, sequence_parallel=size)


def test_sequence_parallel_needs_the_ray_backend() -> None:
    with pytest.raises(ValueError, match="trainer.backend=ray"):
        TrainerConfig(backend="local", num_workers=2, sequence_parallel=2)
    assert TrainerConfig(backend="ray", num_workers=4, sequence_parallel=2).sequence_parallel == 2


def test_batch_must_split_over_data_parallel_groups_before_any_actor_starts() -> None:
    # 8 ranks in sequence-parallel pairs: 4 data-parallel groups cannot share 6 rows
    rl = RLConfig(prompts_per_step=3, group_size=2)
    none: Any = None
    with pytest.raises(ValueError, match="number of data-parallel groups 4"):
        RayRLWorkflow(setup_fn=none, prompts=none, algorithm=none,
                      trainer=TrainerConfig(backend="ray", num_workers=8, sequence_parallel=2), rl=rl,
                      dist=DistributedConfig(num_workers=8, sequence_parallel=2))


def test_trainer_and_distributed_configs_must_agree_on_sequence_parallelism() -> None:
    none: Any = None
    with pytest.raises(ValueError, match="distributed.sequence_parallel=1"):
        RayRLWorkflow(setup_fn=none, prompts=none, algorithm=none,
                      trainer=TrainerConfig(backend="ray", num_workers=2, sequence_parallel=2),
                      rl=RLConfig(prompts_per_step=2, group_size=2), dist=DistributedConfig(num_workers=2))

"""The data-parallel x sequence-parallel rank grid and the configs that choose it."""

from __future__ import annotations

from typing import Any

import pytest

from dllm_train import RLConfig, TrainerConfig
from dllm_train.distributed import DistributedConfig, ParallelDims, RayRLWorkflow, rank_dims


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
                      trainer=TrainerConfig(backend="ray", num_workers=8, sequence_parallel=2), rl=rl)


def test_the_rank_grid_is_the_trainers() -> None:
    # one source of truth: the Ray backend's ranks and their sequence-parallel groups come from the trainer
    dims = rank_dims(TrainerConfig(backend="ray", num_workers=6, sequence_parallel=3))
    assert (dims.world_size, dims.sequence_parallel, dims.data_parallel) == (6, 3, 2)
    assert not {"num_workers", "sequence_parallel", "gpus_per_worker"} & set(DistributedConfig.__dataclass_fields__)
    with pytest.raises(ValueError, match="distributed.placement_strategy 'NEAR' unknown"):
        DistributedConfig(placement_strategy="NEAR")

"""Distributed backend: FSDP2 ranks, the Ray actor group, Ulysses sequence parallelism and lockstep passes.

The Ray rank stack, from the driver to the models:

- `RayRLWorkflow` (driver) runs `dllm_train.rl_step` over a `RayActorGroup`, the `Ranks` of a Ray run;
- `RayActorGroup` places one `RankActor` per rank and runs rank methods named by reference,
  `group.call(RankWorker.full_weights)` (mypy checks the name, arguments and result);
- `RankActor` is the Ray process shell: it joins the torch.distributed group and builds the rank;
- `RankWorker` is one FSDP2 rank (weight hand-off, sharded checkpoints) around the `PolicyRank`
  that `dllm_train.assemble_rank` builds, the same half of a step as in one process.
"""

from dllm_train.distributed.fsdp import (
    broadcast_parameters,
    full_state_dict,
    handoff_state_dict,
    init_process_group,
    load_full_optimizer_state,
    load_full_state_dict,
    load_sharded_state,
    save_sharded_state,
    shard_model,
    trainable_state_dict,
)
from dllm_train.distributed.parallel_dims import ParallelDims, sequence_parallel_group
from dllm_train.distributed.rank import RankSetup, RankWorker, map_tensors, select_rows
from dllm_train.step import shard_rows
from dllm_train.distributed.ray_backend import DistributedConfig, RankMethod, RayActorGroup, RayRLWorkflow, rank_dims
from dllm_train.distributed.sequence_parallel import (
    SequenceParallelScorer,
    gather_sequence,
    sequence_parallel,
    shard_sequence,
    sp_forward,
    ulysses_attention,
)
from dllm_train.lockstep import group_all, group_max

__all__ = [
    "DistributedConfig",
    "ParallelDims",
    "RankSetup",
    "RankMethod",
    "RankWorker",
    "RayActorGroup",
    "RayRLWorkflow",
    "SequenceParallelScorer",
    "broadcast_parameters",
    "full_state_dict",
    "gather_sequence",
    "group_all",
    "group_max",
    "handoff_state_dict",
    "init_process_group",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "load_sharded_state",
    "save_sharded_state",
    "map_tensors",
    "select_rows",
    "sequence_parallel",
    "sequence_parallel_group",
    "shard_model",
    "rank_dims",
    "shard_rows",
    "shard_sequence",
    "sp_forward",
    "trainable_state_dict",
    "ulysses_attention",
]

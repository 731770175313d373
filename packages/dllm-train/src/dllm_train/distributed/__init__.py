"""Distributed backend: FSDP2 ranks, the Ray actor group and Ulysses sequence parallelism."""

from dllm_train.distributed.fsdp import (
    broadcast_parameters,
    full_optimizer_state,
    full_state_dict,
    init_process_group,
    load_full_optimizer_state,
    shard_model,
)
from dllm_train.distributed.rank import RankSetup, RankWorker, select_rows, shard_rows
from dllm_train.distributed.ray_backend import DistributedConfig, RayActorGroup, RayRLWorkflow
from dllm_train.distributed.sequence_parallel import (
    gather_sequence,
    sequence_parallel,
    shard_sequence,
    sp_forward,
    ulysses_attention,
)

__all__ = [
    "DistributedConfig",
    "RankSetup",
    "RankWorker",
    "RayActorGroup",
    "RayRLWorkflow",
    "broadcast_parameters",
    "full_optimizer_state",
    "full_state_dict",
    "gather_sequence",
    "init_process_group",
    "load_full_optimizer_state",
    "select_rows",
    "sequence_parallel",
    "shard_model",
    "shard_rows",
    "shard_sequence",
    "sp_forward",
    "ulysses_attention",
]

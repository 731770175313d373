"""dllm_train: workers, dataflow and workflow for diffusion LM post-training."""

from dllm_train.checkpointing import (
    CheckpointRef,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dllm_train.config import OptimConfig, RLConfig, SFTConfig, TrainerConfig
from dllm_train.dataflow import Experience, PromptBatch
from dllm_train.likelihood import noised_token_logp
from dllm_train.metrics import MetricsWriter, format_line, plot_curves, read_metrics
from dllm_train.objective import PolicyObjective
from dllm_train.seeding import derive_seed, generator, sample_seeds
from dllm_train.sft import SFTWorker
from dllm_train.workers import ActorWorker, ReferenceWorker, RewardWorker, RolloutWorker, sequence_inputs
from dllm_train.workflow import PhaseSpec, RLWorkflow, Run

__all__ = [
    "ActorWorker",
    "CheckpointRef",
    "Experience",
    "MetricsWriter",
    "OptimConfig",
    "PhaseSpec",
    "PolicyObjective",
    "PromptBatch",
    "RLConfig",
    "RLWorkflow",
    "ReferenceWorker",
    "RewardWorker",
    "RolloutWorker",
    "Run",
    "SFTConfig",
    "SFTWorker",
    "TrainerConfig",
    "derive_seed",
    "format_line",
    "generator",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "noised_token_logp",
    "plot_curves",
    "read_metrics",
    "sample_seeds",
    "save_checkpoint",
    "sequence_inputs",
]

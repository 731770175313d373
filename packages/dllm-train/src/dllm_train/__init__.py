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
from dllm_train.evaluation import benchmark_validator
from dllm_train.likelihood import Scorer, noised_token_logp, plan_token_logp
from dllm_train.lockstep import lockstep_passes
from dllm_train.metrics import MetricsWriter, format_line, open_wandb, plot_curves, read_metrics
from dllm_train.objective import PolicyObjective, at_iteration, default_update
from dllm_train.preference import PreferenceBatch, PreferenceObjective, PreferenceWorker
from dllm_train.seeding import derive_seed, generator, sample_seeds
from dllm_train.sft import SFTWorker
from dllm_train.workers import (
    ActorWorker,
    ReferenceWorker,
    RewardWorker,
    RolloutWorker,
    sampling_for,
    sequence_inputs,
)
from dllm_train.workflow import PhaseSpec, RLWorkflow, Run, local_rl_workflow

__all__ = [
    "ActorWorker",
    "CheckpointRef",
    "Experience",
    "MetricsWriter",
    "OptimConfig",
    "PhaseSpec",
    "PolicyObjective",
    "PreferenceBatch",
    "PreferenceObjective",
    "PreferenceWorker",
    "PromptBatch",
    "RLConfig",
    "RLWorkflow",
    "ReferenceWorker",
    "RewardWorker",
    "RolloutWorker",
    "Run",
    "SFTConfig",
    "SFTWorker",
    "Scorer",
    "at_iteration",
    "default_update",
    "TrainerConfig",
    "benchmark_validator",
    "derive_seed",
    "format_line",
    "generator",
    "latest_checkpoint",
    "list_checkpoints",
    "local_rl_workflow",
    "lockstep_passes",
    "load_checkpoint",
    "noised_token_logp",
    "open_wandb",
    "plan_token_logp",
    "plot_curves",
    "read_metrics",
    "sample_seeds",
    "sampling_for",
    "save_checkpoint",
    "sequence_inputs",
]

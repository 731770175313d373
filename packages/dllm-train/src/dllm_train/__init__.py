"""dllm_train: workers, dataflow, the RL step and the run loop for diffusion LM post-training."""

from dllm_train.checkpointing import (
    CheckpointMismatch,
    CheckpointRef,
    LegacyCheckpointRefused,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)
from dllm_train.algorithm import CriticInputs, CriticSpec, CriticTargets, LossInputs, MiniBatchRows, RLAlgorithm, RLBatch, SpecialTokens, mini_batch_slices, with_fields
from dllm_train.config import OptimConfig, RLConfig, SFTConfig, TrainerConfig
from dllm_train.dataflow import PromptBatch
from dllm_train.evaluation import benchmark_validator
from dllm_train.likelihood import Scorer, plan_token_logp
from dllm_train.folder_files import FolderWriteError, SymlinkRefused, find_symlinks, open_nofollow, replace_text
from dllm_train.metrics import MetricsWriter, format_line, open_wandb, plot_curves, read_metrics
from dllm_train.optim import OptimizerStep
from dllm_train.preemption import Diverged, Interrupted
from dllm_train.passes import ScoreCall, Update, ValuesFn, ValuesScorer, accumulate, evaluate
from dllm_train.seeding import derive_seed, generator, sample_seeds
from dllm_train.objective import Objective, OfflineInputs, OfflineObjective
from dllm_train.offline import OfflineWorker
from dllm_train.rollout_record import RolloutSaver, check_rollout_record, read_rollouts, rollout_path
from dllm_train.step import LocalRanks, PolicyRank, RankRollout, Ranks, check_settings, rl_step
from dllm_train.algorithm import Prepared
from dllm_train.workers import (
    ActorWorker,
    ReferenceWorker,
    RewardWorker,
    RolloutWorker,
    sampling_for,
    sequence_inputs,
    special_tokens,
)
from dllm_train.model_setup import BaseWeightsScorer, OffloadedScorer, resolved_attention, set_activation_checkpointing
from dllm_train.assembly import assemble_rank
from dllm_train.local import LocalRL
from dllm_train.critic import ValueScorer, ValueWorker
from dllm_train.run import PhaseSpec, Run, ShardedStateful

__all__ = [
    "ActorWorker",
    "BaseWeightsScorer",
    "CheckpointMismatch",
    "CheckpointRef",
    "CriticInputs",
    "CriticSpec",
    "CriticTargets",
    "Diverged",
    "FolderWriteError",
    "Interrupted",
    "LegacyCheckpointRefused",
    "LocalRL",
    "LocalRanks",
    "LossInputs",
    "MiniBatchRows",
    "MetricsWriter",
    "Objective",
    "OfflineInputs",
    "OfflineObjective",
    "OfflineWorker",
    "OffloadedScorer",
    "OptimConfig",
    "OptimizerStep",
    "PhaseSpec",
    "PolicyRank",
    "Prepared",
    "PromptBatch",
    "RLAlgorithm",
    "RLBatch",
    "RLConfig",
    "RankRollout",
    "Ranks",
    "ReferenceWorker",
    "RewardWorker",
    "RolloutSaver",
    "RolloutWorker",
    "Run",
    "SFTConfig",
    "ShardedStateful",
    "ScoreCall",
    "Scorer",
    "SpecialTokens",
    "SymlinkRefused",
    "TrainerConfig",
    "Update",
    "ValueScorer",
    "ValueWorker",
    "ValuesFn",
    "ValuesScorer",
    "accumulate",
    "assemble_rank",
    "benchmark_validator",
    "check_rollout_record",
    "check_settings",
    "derive_seed",
    "evaluate",
    "find_symlinks",
    "format_line",
    "generator",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "mini_batch_slices",
    "open_nofollow",
    "open_wandb",
    "plan_token_logp",
    "plot_curves",
    "read_metrics",
    "replace_text",
    "resolved_attention",
    "rl_step",
    "sample_seeds",
    "read_rollouts",
    "rollout_path",
    "sampling_for",
    "read_checkpoint",
    "resume_checkpoint",
    "save_checkpoint",
    "sequence_inputs",
    "set_activation_checkpointing",
    "special_tokens",
    "with_fields",
]

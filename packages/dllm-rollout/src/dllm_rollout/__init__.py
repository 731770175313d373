"""dllm_rollout: diffusion LM samplers, KV-cached decoding and engine adapters."""

from dllm_rollout.batch import RolloutBatch, response_mask
from dllm_rollout.config import SamplingConfig, SpeedConfig, configure, on_model_grid
from dllm_rollout.consistency import consistency_gap
from dllm_rollout.generate import decode, generate
from dllm_rollout.masked import transfer_quota
from dllm_rollout.progress import NonFiniteLogits
from dllm_rollout.prompts import left_pad, sample_seeds
from dllm_rollout.sampling import filter_logits
from dllm_rollout.tree import TreeRollout, tree_generate

__all__ = [
    "NonFiniteLogits",
    "RolloutBatch",
    "SamplingConfig",
    "SpeedConfig",
    "TreeRollout",
    "configure",
    "on_model_grid",
    "consistency_gap",
    "decode",
    "filter_logits",
    "generate",
    "left_pad",
    "response_mask",
    "sample_seeds",
    "transfer_quota",
    "tree_generate",
]

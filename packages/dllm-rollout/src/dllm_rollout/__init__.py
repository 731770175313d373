"""dllm_rollout: diffusion LM samplers, KV-cached decoding and engine adapters."""

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.config import SamplingConfig
from dllm_rollout.generate import decode, generate, response_mask
from dllm_rollout.masked import transfer_quota
from dllm_rollout.prompts import left_pad, sample_seeds

__all__ = [
    "RolloutBatch",
    "SamplingConfig",
    "decode",
    "generate",
    "left_pad",
    "response_mask",
    "sample_seeds",
    "transfer_quota",
]

"""dllm_rollout: diffusion LM samplers, KV-cached decoding and engine adapters."""

from dllm_rollout.batch import RolloutBatch, response_mask
from dllm_rollout.config import SamplingConfig, SpeedConfig, configure, on_model_grid
from dllm_rollout.consistency import consistency_gap
from dllm_rollout.generate import decode, generate
from dllm_rollout.masked import transfer_quota
from dllm_rollout.progress import NonFiniteLogits
from dllm_rollout.record_schema import (
    BACKENDS,
    RECORD_FIELDS,
    RECORD_VERSION,
    RecordField,
    backend_of,
    record_fields_filled,
    record_settings,
    requested_fields,
)
from dllm_rollout.rollout_file import load_rollout, rollout_bytes, rollout_from_bytes, save_rollout
from dllm_rollout.prompts import left_pad, sample_seeds
from dllm_rollout.sampling import filter_logits
from dllm_rollout.tree import TreeRollout, tree_generate

__all__ = [
    "BACKENDS",
    "NonFiniteLogits",
    "RECORD_FIELDS",
    "RECORD_VERSION",
    "RecordField",
    "RolloutBatch",
    "SamplingConfig",
    "SpeedConfig",
    "TreeRollout",
    "backend_of",
    "configure",
    "on_model_grid",
    "consistency_gap",
    "decode",
    "filter_logits",
    "generate",
    "left_pad",
    "load_rollout",
    "record_fields_filled",
    "record_settings",
    "requested_fields",
    "response_mask",
    "rollout_bytes",
    "rollout_from_bytes",
    "sample_seeds",
    "save_rollout",
    "transfer_quota",
    "tree_generate",
]

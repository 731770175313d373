"""dllm_models: native diffusion LM families, attention backends and checkpoint I/O."""

from dllm_models.attention import BACKENDS, AttentionMask, attend
from dllm_models.checkpoint import load_model, read_config, save_model, weight_files
from dllm_models.families.llada import LLaDAConfig, LLaDAModel
from dllm_models.protocol import DiffusionLM, DiffusionTraits, KVCache, ModelOutput
from dllm_models.registry import FAMILIES, build_model, family_for
from dllm_models.tokenizer import load_tokenizer

__all__ = [
    "BACKENDS",
    "FAMILIES",
    "AttentionMask",
    "DiffusionLM",
    "DiffusionTraits",
    "KVCache",
    "LLaDAConfig",
    "LLaDAModel",
    "ModelOutput",
    "attend",
    "build_model",
    "family_for",
    "load_model",
    "load_tokenizer",
    "read_config",
    "save_model",
    "weight_files",
]

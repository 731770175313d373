"""dllm_models: native diffusion LM families, attention backends and checkpoint I/O."""

from dllm_models.attention import BACKENDS, AttentionMask, attend
from dllm_models.checkpoint import (
    CheckpointFilesError,
    NoWeightsError,
    generation_stop_ids,
    load_model,
    read_config,
    save_leftovers,
    save_model,
    weight_files,
    with_stop_ids,
)
from dllm_models.families.llada import LLaDAConfig, LLaDAModel
from dllm_models.layers import KernelConfig, set_kernels
from dllm_models.protocol import DiffusionTraits, KVCache, ModelOutput
from dllm_models.registry import (
    FAMILIES,
    FAMILY_NAMES,
    MODEL_TYPES,
    Family,
    build_model,
    empty_model,
    family_for,
    family_kind,
    family_names,
    get_family,
)
from dllm_models.char_tokenizer import char_tokenizer
from dllm_models.tokenizer import has_tokenizer, load_tokenizer

__all__ = [
    "KernelConfig",
    "set_kernels",
    "BACKENDS",
    "FAMILIES",
    "FAMILY_NAMES",
    "MODEL_TYPES",
    "AttentionMask",
    "CheckpointFilesError",
    "NoWeightsError",
    "DiffusionTraits",
    "Family",
    "KVCache",
    "LLaDAConfig",
    "LLaDAModel",
    "ModelOutput",
    "attend",
    "build_model",
    "empty_model",
    "family_for",
    "family_kind",
    "family_names",
    "get_family",
    "char_tokenizer",
    "has_tokenizer",
    "generation_stop_ids",
    "load_model",
    "load_tokenizer",
    "read_config",
    "save_leftovers",
    "save_model",
    "weight_files",
    "with_stop_ids",
]

from dllm_models.families.dream import DreamConfig, DreamModel  # noqa: E402
from dllm_models.families.llada2 import LLaDA2Config, LLaDA2Model  # noqa: E402
from dllm_models.families.sdar import SDARConfig, SDARModel  # noqa: E402
from dllm_models.families.sdar_moe import SDARMoeConfig, SDARMoeModel  # noqa: E402

__all__ += [
    "DreamConfig",
    "DreamModel",
    "LLaDA2Config",
    "LLaDA2Model",
    "SDARConfig",
    "SDARModel",
    "SDARMoeConfig",
    "SDARMoeModel",
]

from dllm_models.activation_memory import ActivationBudget, ActivationPlanner  # noqa: E402
from dllm_models.attention import available_backends, bd3lm_mask  # noqa: E402
from dllm_models.logprob import (  # noqa: E402
    final_hidden,
    lm_head_and_hidden,
    model_token_logprobs,
    token_logprobs,
)
from dllm_models.lora import (  # noqa: E402
    BaseWeightsView,
    adapter_state_dict,
    adapters_disabled,
    apply_lora,
    has_adapters,
    merge_lora,
    merged_adapters,
)
from dllm_models.packing import Packed, pack, pack_like, unpack  # noqa: E402

__all__ += [
    "ActivationBudget",
    "ActivationPlanner",
    "BaseWeightsView",
    "Packed",
    "adapter_state_dict",
    "adapters_disabled",
    "merged_adapters",
    "apply_lora",
    "has_adapters",
    "available_backends",
    "bd3lm_mask",
    "final_hidden",
    "lm_head_and_hidden",
    "merge_lora",
    "model_token_logprobs",
    "pack",
    "pack_like",
    "token_logprobs",
    "unpack",
]

from dllm_models.value_model import ValueModel  # noqa: E402

__all__ += ["ValueModel"]

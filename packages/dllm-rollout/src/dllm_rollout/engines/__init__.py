"""Rollout engine adapters: translation layers to SGLang and lmdeploy (optional extras).

The engines themselves are imported lazily inside each module's engine class, so importing this
package never needs sglang or lmdeploy.
"""

from dllm_rollout.batch import batch_from_token_lists
from dllm_rollout.engines.lmdeploy import LMDeployEngine, batch_from_lmdeploy, lmdeploy_engine_config, lmdeploy_gen_config
from dllm_rollout.engines.sglang import SGLangEngine, batch_from_sglang, sglang_algorithm, sglang_sampling_params

__all__ = [
    "LMDeployEngine",
    "SGLangEngine",
    "batch_from_lmdeploy",
    "batch_from_sglang",
    "batch_from_token_lists",
    "lmdeploy_engine_config",
    "lmdeploy_gen_config",
    "sglang_algorithm",
    "sglang_sampling_params",
]

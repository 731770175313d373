"""lmdeploy PyTorch-engine adapter (SDAR) through lmdeploy's `pipeline` API
(docs/generation.md#engines).

Not run against a live engine in this repository: the translation functions are unit-tested on
fake `Response`-like objects (`token_ids`, `finish_reason`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.config import SamplingConfig
from dllm_rollout.engines.common import batch_from_token_lists
from dllm_rollout.prompts import sample_seeds


def lmdeploy_engine_config(cfg: SamplingConfig) -> dict[str, Any]:
    """`PytorchEngineConfig` dLLM fields for `cfg` (static unmasking, or dynamic with a threshold)."""
    if not cfg.block_diffusion:
        raise ValueError("lmdeploy's dLLM path serves block-diffusion models (SDAR); use generate()")
    if cfg.editing_threshold is not None:
        raise ValueError(
            f"editing_threshold={cfg.editing_threshold}: lmdeploy's dLLM strategies have no token "
            "editing; use the SGLang engine (JointThreshold) or generate(), or set editing_threshold=None"
        )
    out: dict[str, Any] = {
        "dllm_block_length": cfg.block_length,
        "dllm_denoising_steps": cfg.steps,
        "dllm_unmasking_strategy": "low_confidence_static" if cfg.threshold is None else "low_confidence_dynamic",
    }
    if cfg.threshold is not None:
        out["dllm_confidence_threshold"] = cfg.threshold
    return out


def lmdeploy_gen_config(cfg: SamplingConfig, seed: int | None = None) -> dict[str, Any]:
    """`GenerationConfig` fields for `cfg`."""
    out: dict[str, Any] = {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p if cfg.top_p is not None else 1.0,
        "top_k": cfg.top_k if cfg.top_k is not None else 0,
        "do_sample": cfg.temperature > 0,
    }
    if seed is not None:
        out["random_seed"] = int(seed)
    return out


def batch_from_lmdeploy(
    outputs: Sequence[Any], prompts: Sequence[Sequence[int]], seeds: torch.Tensor, cfg: SamplingConfig,
    *, eos_id: int, pad_id: int,
) -> RolloutBatch:
    """lmdeploy `Response` objects (`.token_ids`) -> RolloutBatch (engine token ids, no re-tokenising)."""
    return batch_from_token_lists(prompts, [list(o.token_ids) for o in outputs], seeds, cfg, eos_id=eos_id, pad_id=pad_id)


class LMDeployEngine:
    """An lmdeploy `pipeline` on the PyTorch backend serving a block-diffusion model."""

    def __init__(self, model_path: str, cfg: SamplingConfig, *, eos_id: int, pad_id: int, **engine_kwargs: Any) -> None:
        try:
            self.lmdeploy = importlib.import_module("lmdeploy")
        except ImportError as err:
            raise ImportError("LMDeployEngine needs the lmdeploy extra: pip install 'dllm-rollout[lmdeploy]'") from err
        self.cfg, self.eos_id, self.pad_id = cfg, eos_id, pad_id
        backend = self.lmdeploy.PytorchEngineConfig(**lmdeploy_engine_config(cfg), **engine_kwargs)
        self.pipe = self.lmdeploy.pipeline(model_path, backend_config=backend)

    def generate(self, prompts: Sequence[Sequence[int]], seed: int | Sequence[int] | None = None) -> RolloutBatch:
        """Generate one response per prompt from token ids."""
        seeds = sample_seeds(seed, len(prompts))
        gen = [self.lmdeploy.GenerationConfig(**lmdeploy_gen_config(self.cfg, int(s))) for s in seeds.tolist()]
        outputs = self.pipe([list(p) for p in prompts], gen_config=gen)
        return batch_from_lmdeploy(outputs, prompts, seeds, self.cfg, eos_id=self.eos_id, pad_id=self.pad_id)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push weights through lmdeploy's serialised `update_params` request (as its server does)."""
        utils = importlib.import_module("lmdeploy.utils")
        payload = utils.serialize_state_dict(dict(named_tensors))
        self.pipe.async_engine.engine.update_params(
            {"serialized_named_tensors": payload, "finished": True}
        )

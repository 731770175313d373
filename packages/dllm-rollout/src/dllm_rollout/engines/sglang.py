"""SGLang dLLM engine adapter (SDAR, LLaDA2) through SGLang's offline `Engine` API
(docs/generation.md#engines).

Not run against a live engine in this repository: the translation functions are unit-tested on
fake outputs shaped like SGLang's (`{"output_ids": [...], "meta_info": {...}}`).
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch, batch_from_token_lists
from dllm_rollout.config import SamplingConfig
from dllm_rollout.prompts import sample_seeds

DEFAULT_THRESHOLD = 0.95


def sglang_sampling_params(cfg: SamplingConfig, seed: int | None = None, *,
                           stop_ids: Sequence[int] = ()) -> dict[str, Any]:
    """SGLang `SamplingParams` fields for `cfg` (greedy: temperature 0, top_p 1, top_k -1).

    `stop_ids` (the model's `DiffusionTraits.stop_ids`) end a request beside the EOS SGLang reads
    from the folder; `cfg.stop_at_eos=False` ignores them all (`ignore_eos`).
    """
    params: dict[str, Any] = {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p if cfg.top_p is not None else 1.0,
        "top_k": cfg.top_k if cfg.top_k is not None else -1,
        "ignore_eos": not cfg.stop_at_eos,
    }
    if stop_ids:
        params["stop_token_ids"] = [int(t) for t in stop_ids]
    if seed is not None:
        params["sampling_seed"] = int(seed)
    return params


def sglang_algorithm(cfg: SamplingConfig) -> tuple[str, dict[str, Any]]:
    """(`dllm_algorithm`, `dllm_algorithm_config` dict) for `cfg` (docs/generation.md#engines).

    Without editing: `LowConfidence` on `block_size` with `threshold`. With `editing_threshold`
    (LLaDA2.1 token editing): `JointThreshold` with `threshold` (mask-to-token),
    `edit_threshold` (token-to-token) and `max_post_edit_steps` (= `max_post_steps`).
    SGLang commits masks above the threshold (strictly) or the single best one, whatever `steps`
    says; `generate` matches it with `steps=block_length` (up to ties at the threshold).
    """
    if not cfg.block_diffusion:
        raise ValueError("SGLang's dLLM decoders serve block-diffusion models (SDAR, LLaDA2); use generate()")
    threshold = cfg.threshold if cfg.threshold is not None else DEFAULT_THRESHOLD
    if cfg.editing_threshold is None:
        return "LowConfidence", {"block_size": cfg.block_length, "threshold": threshold}
    return "JointThreshold", {
        "block_size": cfg.block_length,
        "threshold": threshold,
        "edit_threshold": cfg.editing_threshold,
        "max_post_edit_steps": cfg.max_post_steps,
    }


def batch_from_sglang(
    outputs: Sequence[dict[str, Any]], prompts: Sequence[Sequence[int]], seeds: torch.Tensor, cfg: SamplingConfig,
    *, stop_ids: Sequence[int], pad_id: int,
) -> RolloutBatch:
    """SGLang `generate` outputs -> RolloutBatch.

    Uses `output_ids`; with `cfg.record_trajectory` the step maps (`return_step_maps=True`, PR #27943
    contract): the 1-based block-local `meta_info["dllm_replay_step_maps"]` become 0-based
    `unmask_step` (`record_fields_filled(cfg, backend="sglang")`); without it they are not kept.

    Raises:
        ValueError: `cfg.record_trajectory` is set and an output carries no step maps.
    """
    responses = [list(o["output_ids"]) for o in outputs]
    steps = None
    if cfg.record_trajectory:
        missing = [i for i, o in enumerate(outputs) if "dllm_replay_step_maps" not in o.get("meta_info", {})]
        if missing:
            raise ValueError(f"record_trajectory=True, but SGLang returned no step maps for prompt {missing[0]}: "
                             "run an SGLang with return_step_maps (PR #27943), or set record_trajectory=False")
        steps = [[int(s) - 1 for s in o["meta_info"]["dllm_replay_step_maps"]] for o in outputs]
    return batch_from_token_lists(prompts, responses, seeds, cfg, stop_ids=stop_ids, pad_id=pad_id, unmask_steps=steps)


class SGLangEngine:
    """An in-process `sglang.srt.entrypoints.engine.Engine` serving a block-diffusion model."""

    def __init__(self, model_path: str, cfg: SamplingConfig, *, stop_ids: Sequence[int], pad_id: int,
                 **engine_kwargs: Any) -> None:
        try:
            sglang = importlib.import_module("sglang")
        except ImportError as err:
            raise ImportError("SGLangEngine needs the sglang extra: pip install 'dllm-rollout[sglang]'") from err
        algorithm, algo_cfg = sglang_algorithm(cfg)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("".join(f"{k}: {v}\n" for k, v in algo_cfg.items()))
        self.cfg, self.stop_ids, self.pad_id = cfg, tuple(int(t) for t in stop_ids), pad_id
        self.engine = sglang.Engine(model_path=model_path, dllm_algorithm=algorithm,
                                    dllm_algorithm_config=f.name, **engine_kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], seed: int | Sequence[int] | None = None) -> RolloutBatch:
        """Generate one response per prompt (token ids in, RolloutBatch out)."""
        seeds = sample_seeds(seed, len(prompts))
        params = [sglang_sampling_params(self.cfg, int(s), stop_ids=self.stop_ids) for s in seeds.tolist()]
        maps = {"return_step_maps": True} if self.cfg.record_trajectory else {}
        outputs = self.engine.generate(input_ids=[list(p) for p in prompts], sampling_params=params, **maps)
        return batch_from_sglang(outputs, prompts, seeds, self.cfg, stop_ids=self.stop_ids, pad_id=self.pad_id)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push weights with SGLang's `update_weights_from_tensor`, flushing the cache at the end."""
        items = list(named_tensors)
        for i, (name, tensor) in enumerate(items):
            self.engine.update_weights_from_tensor([(name, tensor)], flush_cache=i == len(items) - 1)

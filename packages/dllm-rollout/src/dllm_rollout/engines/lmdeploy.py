"""lmdeploy PyTorch-engine adapter for block-diffusion models (SDAR, SDAR-MoE), lmdeploy 0.18
(docs/generation.md#engines).

What the adapter maps, and what it refuses (each refusal names the field and the fix):

- Decoding: `dllm_block_length`, `dllm_denoising_steps` and the unmasking strategy:
  `low_confidence_static` for the quota (`remasking="low_confidence"`, no threshold), and
  `low_confidence_dynamic` at the same threshold for `remasking="low_confidence_dynamic"`
  (DARE's threshold rule, docs/generation.md#threshold-rule). lmdeploy commits
  `block_length // steps` tokens per static step, so `steps` must divide `block_length`; its
  dynamic strategy commits the best mask plus every mask at or over the threshold, which is
  `generate`'s rule at one token per step (`steps == block_length`) up to a confidence exactly at
  the threshold (lmdeploy compares with >=, SGLang, LLaDA2 and `generate` with >). A threshold
  with `remasking="low_confidence"` (filtered confidence, >=) and token editing are refused.
- Sampling: temperature, top-k and top-p, the same for every row of a call (lmdeploy 0.18's dLLM
  sampler repeats per-sequence settings block-major while its logits are sequence-major, so mixed
  per-row settings would reach the wrong rows; `tests/dllm_rollout/test_lmdeploy.py` holds the
  reproduction). Per-row seeds are not passed for the same reason: an engine rollout is not
  replayable from its seeds (`LMDeployEngine.replayable` is False), which the trainer does not
  need, since it recomputes the old log-probs. lmdeploy 0.18 reports no steps, so the record holds
  no step maps and no `forwards` (`record_fields_filled(cfg, backend="lmdeploy")`).
- Prompts are token ids (`AsyncEngine.preprocess(input_ids=...)`; `pipe(...)` takes text only).
  Every stop id of the model (`DiffusionTraits.stop_ids`: its EOS and, for SDAR chat models,
  `<|im_end|>`) ends a request, and the stop token is kept in the output (`include_stop_str_in_output`).
  lmdeploy itself adds the tokenizer's EOS and generation_config.json's `eos_token_id` list to every
  request's stop ids (`GenerationConfig.update_from_hf_gen_cfg`); `load_model` reads the same list into
  `traits.stop_ids`, so the response mask cuts where the engine stopped.
- A release folder without `configuration_sdar.py` loads as a bare transformers config:
  `hf_overrides` supplies the pad id and the RoPE parameters from the folder's own files.
- Weights: `load_weights` hands a policy's tensors (release names) to the engine's model in
  process, through the same loader lmdeploy's own weight updates use. That needs lmdeploy's
  single-GPU executor (one engine per training rank, colocated); an engine in other processes
  would take `UpdateParamsRequest`, which 0.18 implements only for its Ray executor.
  `sleep` frees the engine's weights and KV cache on the GPU during the update; `wake` restores
  them, optionally loading new weights first.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch, batch_from_token_lists
from dllm_rollout.config import SamplingConfig
from dllm_rollout.prompts import sample_seeds


def lmdeploy_engine_config(cfg: SamplingConfig) -> dict[str, Any]:
    """`PytorchEngineConfig` dLLM fields for `cfg` (static unmasking, or dynamic with a threshold).

    Raises:
        ValueError: for settings lmdeploy's dLLM strategies cannot run as `generate` does.
    """
    if not cfg.block_diffusion:
        raise ValueError("lmdeploy's dLLM path serves block-diffusion models (SDAR); use generate()")
    if cfg.editing_threshold is not None:
        raise ValueError(
            f"editing_threshold={cfg.editing_threshold}: lmdeploy's dLLM strategies have no token "
            "editing; use the SGLang engine (JointThreshold) or generate(), or set editing_threshold=None"
        )
    if cfg.block_length % cfg.steps:
        raise ValueError(
            f"rollout.steps={cfg.steps} does not divide block_length={cfg.block_length}: lmdeploy commits "
            f"block_length // steps tokens per step and would leave masks; use steps that divide it"
        )
    dynamic = cfg.remasking == "low_confidence_dynamic"
    if cfg.threshold is not None and not dynamic:
        raise ValueError(
            f"rollout.threshold={cfg.threshold} with rollout.remasking={cfg.remasking!r} (the quota plus every mask "
            ">= threshold by its filtered probability) is not an lmdeploy strategy; lmdeploy's low_confidence_dynamic "
            "is rollout.remasking=low_confidence_dynamic"
        )
    if dynamic and cfg.steps != cfg.block_length:
        raise ValueError(
            f"rollout.steps={cfg.steps} with remasking='low_confidence_dynamic': lmdeploy's dynamic strategy commits "
            f"at least one token per step, generate() the quota block_length // steps; set "
            f"rollout.steps={cfg.block_length}"
        )
    out: dict[str, Any] = {
        "dllm_block_length": cfg.block_length,
        "dllm_denoising_steps": cfg.steps,
        "dllm_unmasking_strategy": "low_confidence_dynamic" if dynamic else "low_confidence_static",
    }
    if dynamic:
        out["dllm_confidence_threshold"] = cfg.threshold
    return out


def lmdeploy_gen_config(cfg: SamplingConfig, *, stop_ids: Sequence[int]) -> dict[str, Any]:
    """`GenerationConfig` fields for `cfg`: the same for every row (see the module doc).

    Greedy (temperature 0) is `do_sample=False`; lmdeploy's top-k 0 means no top-k filter.
    """
    if not stop_ids or any(int(t) < 0 for t in stop_ids):
        raise ValueError(f"stop_ids={list(stop_ids)}: lmdeploy indexes the logits with its stop ids; pass the "
                         "model's traits.stop_ids")
    return {
        "max_new_tokens": cfg.max_new_tokens,
        "do_sample": cfg.temperature > 0,
        "temperature": cfg.temperature if cfg.temperature > 0 else 1.0,
        "top_p": cfg.top_p if cfg.top_p is not None else 1.0,
        "top_k": cfg.top_k if cfg.top_k is not None else 0,
        "stop_token_ids": [int(t) for t in stop_ids],
        "include_stop_str_in_output": True,
        "ignore_eos": not cfg.stop_at_eos,
    }


def hf_overrides(folder: str | Path) -> dict[str, Any]:
    """`hf_overrides` a release folder needs when it lacks the model's remote-code config class.

    lmdeploy then reads config.json as a bare transformers config, which has no pad id and no
    RoPE parameters; both come from the folder's own config.json and generation_config.json.
    Returns {} when the folder ships `configuration_*.py` (its config class supplies them).
    """
    path = Path(folder)
    if any(path.glob("configuration_*.py")):
        return {}
    config = json.loads((path / "config.json").read_text())
    gen_file = path / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.exists() else {}
    pad = config.get("pad_token_id", gen.get("pad_token_id"))
    if pad is None:
        raise ValueError(f"{path}: neither config.json nor generation_config.json has pad_token_id; "
                         "lmdeploy's SDAR model needs one")
    rope = dict(config.get("rope_scaling") or {"rope_type": "default"})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = float(config.get("rope_theta", 10000.0))
    return {"pad_token_id": int(pad), "rope_parameters": rope}


def batch_from_lmdeploy(
    outputs: Sequence[Any], prompts: Sequence[Sequence[int]], seeds: torch.Tensor, cfg: SamplingConfig,
    *, stop_ids: Sequence[int], pad_id: int,
) -> RolloutBatch:
    """lmdeploy outputs (`.token_ids`, with the stop token kept) -> RolloutBatch (no re-tokenising).

    Raises:
        RuntimeError: when the engine answered a request with an error or aborted it.
    """
    for i, o in enumerate(outputs):
        if getattr(o, "finish_reason", None) in ("error", "abort"):
            raise RuntimeError(f"lmdeploy failed on prompt {i}: {getattr(o, 'response', '') or 'no message'}")
    return batch_from_token_lists(prompts, [list(o.token_ids or []) for o in outputs], seeds, cfg,
                                  stop_ids=stop_ids, pad_id=pad_id)


@dataclass(frozen=True)
class EngineOutput:
    """One request's whole output: every generated token id, why it ended, and its text."""

    token_ids: list[int]
    finish_reason: str | None
    response: str = ""


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""lmdeploy's fused linears: its name -> the release names concatenated along the output axis."""


@dataclass(frozen=True)
class WeightsCheck:
    """What `compare_served` found: tensors compared exactly, and the names that differ."""

    compared: int
    mismatched: tuple[str, ...]
    total: int

    @property
    def ok(self) -> bool:
        """Every served tensor had a reference and equalled it."""
        return not self.mismatched and self.compared == self.total


def _reference_for(name: str, reference: Mapping[str, torch.Tensor]) -> list[torch.Tensor] | None:
    """The policy tensors behind served tensor `name`, in the engine's row order (several for a fused
    linear), or None when the policy has none."""
    if name in reference:
        return [reference[name]]
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            pieces = [reference.get(name.replace(f".{fused}.", f".{p}.")) for p in parts]
            if all(p is not None for p in pieces):
                return [p for p in pieces if p is not None]
    return None


def _stacks(tensor: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    """Whether `parts` stacked along dim 0 have `tensor`'s shape (one part: the same shape)."""
    if len(parts) == 1:
        return parts[0].shape == tensor.shape
    return (tensor.dim() > 0 and sum(p.shape[0] for p in parts) == tensor.shape[0]
            and all(p.shape[1:] == tensor.shape[1:] for p in parts))


def _equal_rows(tensor: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    """Whether `tensor` equals `parts` stacked along dim 0, compared on views (no stacked copy)."""
    views = [tensor] if len(parts) == 1 else torch.split(tensor, [p.shape[0] for p in parts])
    return all(torch.equal(v, p.to(device=tensor.device, dtype=tensor.dtype)) for v, p in zip(views, parts))


def compare_served(served: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> WeightsCheck:
    """Exact comparison of an engine's tensors with the policy's (fused linears compared part by part).

    A served tensor with no reference counts as a mismatch, so a check passes only when the engine
    serves exactly the policy's weights.

    Args:
        served: the engine's tensors by its names; reference: the policy's by release names.
    """
    bad: list[str] = []
    compared = 0
    for name, tensor in served.items():
        parts = _reference_for(name, reference)
        if parts is None or not _stacks(tensor, parts):
            bad.append(name)
            continue
        compared += 1
        if not _equal_rows(tensor, parts):
            bad.append(name)
    return WeightsCheck(compared=compared, mismatched=tuple(bad), total=len(served))


class LMDeployEngine:
    """An lmdeploy pipeline on the PyTorch backend serving a block-diffusion model.

    Args:
        model_path: a release-layout folder (config.json, tokenizer, safetensors).
        cfg: the decoding settings (`lmdeploy_engine_config` says what is refused).
        stop_ids: the ids that end a response (`DiffusionTraits.stop_ids`); pad_id: the padding id.
        engine_options: further `PytorchEngineConfig` fields (`cache_max_entry_count`,
            `max_batch_size`, `session_len`, ...).
    """

    replayable = False
    """Engine rollouts are not replayable from their seeds (see the module doc)."""

    def __init__(self, model_path: str | Path, cfg: SamplingConfig, *, stop_ids: Sequence[int], pad_id: int,
                 engine_options: Mapping[str, Any] | None = None) -> None:
        try:
            self.lmdeploy = importlib.import_module("lmdeploy")
        except ImportError as err:
            raise ImportError("rollout.engine=lmdeploy needs the lmdeploy extra: pip install 'dllm-rollout[lmdeploy]'"
                              ) from err
        self.cfg, self.stop_ids, self.pad_id = cfg, tuple(int(t) for t in stop_ids), pad_id
        lmdeploy_gen_config(cfg, stop_ids=self.stop_ids)  # bad stop ids fail here, before the engine starts
        options = {**lmdeploy_engine_config(cfg), **dict(engine_options or {})}
        overrides = hf_overrides(model_path)
        if overrides and "hf_overrides" not in options:
            options["hf_overrides"] = overrides
        backend = self.lmdeploy.PytorchEngineConfig(**options)
        self.pipe = self.lmdeploy.pipeline(str(model_path), backend_config=backend)
        self.sleeping = False

    @property
    def _async_engine(self) -> Any:
        return self.pipe.async_engine

    def _run(self, coro: Any) -> Any:
        """Run `coro` on the pipeline's own event loop (the engine lives there) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.pipe.internal_thread.loop).result()

    async def _one(self, ids: list[int], gen: Any) -> EngineOutput:
        """One request; `AsyncEngine.generate` yields the new tokens in chunks, then a last chunk
        (empty, or the stop token with `include_stop_str_in_output`): they are concatenated, as
        lmdeploy's own `Pipeline.infer` does."""
        engine = self._async_engine
        request = await engine.preprocess(messages=None, session_id=self.pipe.session_mgr.get(), gen_config=gen,
                                          input_ids=ids)
        tokens: list[int] = []
        reason: str | None = None
        text: list[str] = []
        async for item in engine.generate(request, stream_response=False):
            tokens += list(item.token_ids or [])
            reason = item.finish_reason or reason
            text.append(str(getattr(item, "response", "") or ""))
        return EngineOutput(token_ids=tokens, finish_reason=reason, response="".join(text))

    async def _all(self, prompts: Sequence[list[int]], gen: Any) -> list[EngineOutput]:
        return list(await asyncio.gather(*[self._one(p, gen) for p in prompts]))

    def generate(self, prompts: Sequence[Sequence[int]], seed: int | Sequence[int] | None = None, *,
                 cfg: SamplingConfig | None = None) -> RolloutBatch:
        """Generate one response per prompt from token ids (`seed` is recorded, not replayable).

        Args:
            cfg: decoding settings for this call (default: the engine's own `self.cfg`); the block
                length, step count, remasking and threshold must be the engine's (they are fixed
                when it starts).
        """
        if self.sleeping:
            raise RuntimeError("the lmdeploy engine is asleep; call wake() before generate()")
        cfg = cfg or self.cfg
        if (cfg.block_length, cfg.steps) != (self.cfg.block_length, self.cfg.steps):
            raise ValueError(f"block_length={cfg.block_length}, steps={cfg.steps}: the engine was started with "
                             f"block_length={self.cfg.block_length}, steps={self.cfg.steps}; start another engine")
        if (cfg.remasking, cfg.threshold) != (self.cfg.remasking, self.cfg.threshold):
            raise ValueError(f"remasking={cfg.remasking!r}, threshold={cfg.threshold}: the engine was started with "
                             f"remasking={self.cfg.remasking!r}, threshold={self.cfg.threshold} (its unmasking "
                             "strategy); start another engine")
        seeds = sample_seeds(seed, len(prompts))
        gen = self.lmdeploy.GenerationConfig(**lmdeploy_gen_config(cfg, stop_ids=self.stop_ids))
        outputs = self._run(self._all([[int(t) for t in p] for p in prompts], gen))
        return batch_from_lmdeploy(outputs, prompts, seeds, cfg, stop_ids=self.stop_ids, pad_id=self.pad_id)

    def sleep(self) -> None:
        """Free the engine's weights (to host memory) and KV cache on the GPU."""
        if not self.sleeping:
            self._run(self._async_engine.sleep(1))
            self.sleeping = True

    def _agent(self) -> Any:
        executor = self._async_engine.engine.executor
        agent = getattr(executor, "model_agent", None)
        if agent is None:
            raise NotImplementedError(
                f"in-process weight hand-off needs lmdeploy's single-GPU executor, got {type(executor).__name__}; "
                "run one colocated engine per training rank (tp=1, dp=1)")
        return agent

    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy `named` tensors (release parameter names) into the engine's model, in process.

        The engine must be awake (`wake(weights)` puts the weights back first).
        """
        if self.sleeping:
            raise RuntimeError("wake the engine before loading weights: LMDeployEngine.wake(weights)")
        agent = self._agent()
        with agent.all_context(), torch.inference_mode():
            agent._load_updated_weight_bucket([(k, v.detach()) for k, v in named], "dllm_rollout")
            agent._finalize_updated_weights()

    def wake(self, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Restore the weights, load `weights` into them if given, then rebuild the KV cache."""
        engine = self._async_engine
        if self.sleeping:
            engine.wakeup(["weights"])
            self.sleeping = False
            if weights is not None:
                self.load_weights(weights)
            engine.wakeup(["kv_cache"])
        elif weights is not None:
            self.load_weights(weights)

    def served_tensors(self) -> dict[str, torch.Tensor]:
        """The engine model's own parameters by lmdeploy's names (fused ones, e.g. `qkv_proj`, differ)."""
        model = self._agent().patched_model.get_model()
        return dict(model.named_parameters())

    def check_weights(self, reference: Mapping[str, torch.Tensor]) -> WeightsCheck:
        """Compare the tensors the engine serves with `reference` (release names), exactly."""
        return compare_served(self.served_tensors(), reference)

    def close(self) -> None:
        """Stop the engine and free its memory."""
        self.pipe.close()

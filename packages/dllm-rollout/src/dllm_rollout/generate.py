"""`generate`: the plain entry point of dllm_rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.block import decode_blocks
from dllm_rollout.config import SamplingConfig
from dllm_rollout.masked import decode_masked
from dllm_rollout.prompts import left_pad, sample_seeds


def decode(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
           cfg: SamplingConfig, ref_model: Any = None) -> RolloutBatch:
    """Decode a left-padded batch: block diffusion if `cfg.block_diffusion`, else masked diffusion.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompt ids and real-token mask.
        seeds: [B] per-sample seeds.
        cfg: the sampling configuration.
        ref_model: optional reference model scored on the same canvases (`ref_step_logp`).
    """
    if cfg.block_diffusion:
        return decode_blocks(model, prompt_ids, prompt_mask, seeds, cfg, ref_model)
    return decode_masked(model, prompt_ids, prompt_mask, seeds, cfg, ref_model)


def generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    steps: int,
    block_length: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    cache: str | None = None,
    threshold: float | None = None,
    seed: int | Sequence[int] | None = None,
    eos_handling: str = "keep",
    record_trajectory: bool = False,
    top_k: int | None = None,
    top_p: float | None = None,
    alg_temp: float | None = None,
    stop_at_eos: bool = True,
    record_steps: bool = False,
    ref_model: Any = None,
    editing_threshold: float | None = None,
    max_post_steps: int = 16,
) -> RolloutBatch:
    """Generate responses for prompts of any lengths with a diffusion LM.

    Dispatches on `model.traits.block_length`: None selects masked diffusion (LLaDA, Dream; with
    temperature 0 and no cache the plain reference decoder of LLaDA, docs/generation.md#llada:
    semi-autoregressive blocks, `steps // num_blocks` steps per block, low-confidence remasking, no
    special treatment of EOS); an int selects block diffusion on the global grid (SDAR, LLaDA2,
    docs/generation.md#sdar, #llada2),
    where `steps` counts denoising steps per block and `block_length` must equal the model's.

    Args:
        model: a dllm_models family module (has `traits` and a padded-batch forward).
        prompts: B lists of token ids, any lengths (left-padded internally).
        max_new_tokens: response length.
        steps: total denoising steps (masked) or steps per block (block diffusion).
        block_length: block size (masked: divides max_new_tokens; block diffusion: the model's).
        temperature: sampling temperature (0 = argmax).
        remasking: "low_confidence", "random", or Dream's "origin", "maskgit_plus",
            "topk_margin", "entropy".
        cache: None, "prefix" or "dual" (masked, approximate); None or "prefix" (block, exact).
        threshold: confidence threshold for parallel decoding (commits at least one per step).
        seed: an int (per-sample seeds derived from it), one seed per prompt, or None.
        eos_handling: "keep" or "truncate" (which response tokens `response_mask` counts).
        record_trajectory: record unmask steps and per-step log-probs.
        top_k, top_p: restrict the proposal distribution (Dream order: top-p, then top-k).
        alg_temp: Dream: sample positions from softmax(confidence / alg_temp).
        stop_at_eos: block diffusion: stop a row after a block that produced EOS.
        record_steps: record canvases, proposals and confidences of every step.
        ref_model: a second model scored on the same canvases (`ref_step_logp`).
        editing_threshold: block diffusion: LLaDA2.1 token editing (needs `threshold`); None: off.
        max_post_steps: with editing, at most this many steps per block after its last mask.

    Returns:
        RolloutBatch with `response_ids` [B, max_new_tokens].
    """
    native = model.traits.block_length
    if native is not None and block_length != native:
        raise ValueError(
            f"block_length ({block_length}) must equal the model's block_length ({native}) for "
            "block diffusion: its attention mask uses that grid; build the model with another "
            "block size to decode with one"
        )
    cfg = SamplingConfig(
        max_new_tokens=max_new_tokens, steps=steps, block_length=block_length,
        temperature=temperature, top_k=top_k, top_p=top_p, remasking=remasking, alg_temp=alg_temp,
        cache=cache, threshold=threshold, eos_handling=eos_handling, stop_at_eos=stop_at_eos,
        editing_threshold=editing_threshold, max_post_steps=max_post_steps,
        record_trajectory=record_trajectory or ref_model is not None, record_steps=record_steps,
        block_diffusion=native is not None,
    )
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, model.traits.pad_token_id, device)
    return decode(model, ids, mask, sample_seeds(seed, len(prompts)), cfg, ref_model)

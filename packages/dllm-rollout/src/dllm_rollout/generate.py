"""`generate`: the plain entry point of dllm_rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.block import decode_blocks
from dllm_rollout.budget import align_to_block_grid
from dllm_rollout.config import SamplingConfig, configure, on_model_grid
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
        out = decode_blocks(model, prompt_ids, prompt_mask, seeds, cfg, ref_model)
        return align_to_block_grid(out) if cfg.block_aligned_budget else out
    return decode_masked(model, prompt_ids, prompt_mask, seeds, cfg, ref_model)


def generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    cfg: SamplingConfig | None = None,
    *,
    seed: int | Sequence[int] | None = None,
    ref_model: Any = None,
    **settings: Any,
) -> RolloutBatch:
    """Generate responses for prompts of any lengths with a diffusion LM.

    Dispatches on `model.traits.block_length`: None selects masked diffusion (LLaDA, Dream; with
    temperature 0 and no cache the plain reference decoder of LLaDA, docs/generation.md#llada:
    semi-autoregressive blocks, `steps // num_blocks` steps per block, low-confidence remasking, no
    special treatment of EOS); an int selects block diffusion on the global grid (SDAR, LLaDA2,
    docs/generation.md#sdar, #llada2),
    where `steps` counts denoising steps per block and `block_length` must equal the model's.

    The decoding settings are one `SamplingConfig`: pass it as `cfg`, or its fields as keywords
    (`generate(model, prompts, max_new_tokens=256, steps=256, block_length=32)`), or both (the
    keywords replace the config's fields). The model sets `block_diffusion`; `ref_model` turns
    on `record_trajectory`.

    Args:
        model: a dllm_models family module (has `traits` and a padded-batch forward).
        prompts: B lists of token ids, any lengths (left-padded internally).
        cfg: the decoding settings (None: `settings` alone).
        seed: an int (per-sample seeds derived from it), one seed per prompt, or None.
        ref_model: a second model scored on the same canvases (`ref_step_logp`).
        settings: SamplingConfig fields by name (see its docstring); any other name raises
            TypeError naming it.

    Returns:
        RolloutBatch with `response_ids` [B, max_new_tokens].
    """
    if ref_model is not None:
        settings["record_trajectory"] = True
    native = model.traits.block_length
    settings["block_diffusion"] = native is not None  # (validated as the model decodes it)
    cfg = on_model_grid(configure(cfg, **settings), native)
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, model.traits.pad_token_id, device)
    return decode(model, ids, mask, sample_seeds(seed, len(prompts)), cfg, ref_model)

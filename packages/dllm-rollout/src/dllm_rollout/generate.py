"""`generate`: the plain entry point of dllm_rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.config import SamplingConfig
from dllm_rollout.masked import _confidence, _propose, _select, transfer_quota
from dllm_rollout.prompts import left_pad, sample_seeds


def _logits(model: Any, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = model(canvas, attention_mask=attn, position_ids=pos).logits
    if model.traits.logit_shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


@torch.no_grad()
def decode(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
           cfg: SamplingConfig) -> RolloutBatch:
    """Decode a left-padded batch with low-confidence (or random) remasking in blocks.

    Every step runs one full forward over the canvas (prompt + all blocks); only still-masked
    positions of the current block compete, and committed tokens are never revised.
    """
    traits = model.traits
    device = prompt_ids.device
    b, p = prompt_ids.shape
    r, bl = cfg.max_new_tokens, cfg.block_length
    canvas = torch.cat([prompt_ids, torch.full((b, r), traits.mask_token_id, device=device)], dim=1)
    attn = torch.cat([prompt_mask, torch.ones((b, r), dtype=torch.bool, device=device)], dim=1)
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds.tolist()]
    unmask_step = torch.full((b, r), -1, dtype=torch.long, device=device)
    step_logp = torch.zeros((b, r), dtype=torch.float32, device=device)
    step = 0
    for blk in range(cfg.num_blocks):
        start, end = p + blk * bl, p + (blk + 1) * bl
        quota = transfer_quota(bl, cfg.steps_per_block)
        s = 0
        while bool((canvas[:, start:end] == traits.mask_token_id).any()):
            logits = _logits(model, canvas, attn, pos)[:, start:end]
            x0, logp = _propose(logits, cfg.temperature, gens)
            conf = _confidence(logits, x0, cfg.remasking, gens)
            still = canvas[:, start:end] == traits.mask_token_id
            k = quota[s] if s < len(quota) else bl
            commit = _select(conf, still, k, cfg.threshold)
            canvas[:, start:end] = torch.where(commit, x0, canvas[:, start:end])
            rel = slice(blk * bl, (blk + 1) * bl)
            unmask_step[:, rel] = torch.where(commit, step, unmask_step[:, rel])
            step_logp[:, rel] = torch.where(commit, logp, step_logp[:, rel])
            s += 1
            step += 1
    response = canvas[:, p:]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response,
        response_mask=response_mask(response, traits.eos_token_id, cfg.eos_handling),
        seeds=seeds,
        unmask_step=unmask_step if cfg.record_trajectory else None,
        step_logp=step_logp if cfg.record_trajectory else None,
    )


def response_mask(response: torch.Tensor, eos_id: int, eos_handling: str) -> torch.Tensor:
    """[B, R] bool: all True ("keep"), or True through the first EOS ("truncate")."""
    if eos_handling == "keep":
        return torch.ones_like(response, dtype=torch.bool)
    is_eos = (response == eos_id).long()
    before = is_eos.cumsum(-1) - is_eos
    return before == 0


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
) -> RolloutBatch:
    """Generate responses for prompts of any lengths with a diffusion LM.

    With temperature 0 and no cache this is the plain reference decoder of LLaDA (spec §2.1):
    semi-autoregressive blocks, `steps // num_blocks` steps per block, low-confidence remasking,
    no special treatment of EOS.

    Args:
        model: a dllm_models family module (has `traits` and a padded-batch forward).
        prompts: B lists of token ids, any lengths (left-padded internally).
        max_new_tokens: response length.
        steps: total denoising steps.
        block_length: block size (divides max_new_tokens).
        temperature: sampling temperature (0 = argmax).
        remasking: "low_confidence" or "random".
        cache: None, "prefix" or "dual".
        threshold: confidence threshold for parallel decoding (commits at least one per step).
        seed: an int (per-sample seeds derived from it), one seed per prompt, or None.
        eos_handling: "keep" or "truncate" (which response tokens `response_mask` counts).
        record_trajectory: record unmask steps and per-step log-probs.

    Returns:
        RolloutBatch with `response_ids` [B, max_new_tokens].
    """
    cfg = SamplingConfig(
        max_new_tokens=max_new_tokens, steps=steps, block_length=block_length,
        temperature=temperature, remasking=remasking, cache=cache, threshold=threshold,
        eos_handling=eos_handling, record_trajectory=record_trajectory,
    )
    if cfg.cache is not None:
        raise NotImplementedError(f"cache={cfg.cache!r} is not implemented yet; use cache=None")
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, model.traits.pad_token_id, device)
    return decode(model, ids, mask, sample_seeds(seed, len(prompts)), cfg)

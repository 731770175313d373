"""The full clean prediction of one masked-diffusion step (the per-step record x^(t)).

Algorithms that reward intermediate predictions (He et al., arXiv 2508.13148) score the model's
prediction of the whole response at every denoising step: a token is sampled at every position
from softmax(filter(logits / T)), masked positions take it, committed positions keep their token,
and the record's confidence is the sampled token's probability under that same tempered, filtered
distribution (docs/algorithms.md, per-step records). Decoding itself reads only the current block;
this module adds the rest of the response without touching what the sampler commits: the block's
proposals are the sampler's own, and the other positions draw from a second per-row stream
(`record_noise`), so a run with step records decodes the same responses as one without.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_rollout.config import SamplingConfig
from dllm_rollout.head import block_forward
from dllm_rollout.noise import RowNoise, mix64
from dllm_rollout.sampling import propose

# the record stream's key: mix64 of the decoding stream's key xor this constant (an arbitrary odd
# 64-bit word), so the two streams of a row are unrelated and no row's record stream is another's
_RECORD_STREAM = 0x5DEECE66D


def record_noise(noise: RowNoise) -> RowNoise:
    """A second stream per row of `noise`, for the positions outside the decoded block."""
    sub = RowNoise.__new__(RowNoise)
    sub.key = mix64(noise.key ^ _RECORD_STREAM)
    sub.drawn = torch.zeros_like(noise.drawn)
    return sub


def response_logits(model: Any, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                    prompt_len: int) -> torch.Tensor:
    """[B, R, V] logits predicting every response position of `canvas` [B, P + R] (logit shift applied)."""
    out = block_forward(model, canvas, prompt_len, canvas.shape[1], shift=int(model.traits.logit_shift),
                        attention_mask=attn, position_ids=pos)
    logits: torch.Tensor = out.logits
    return logits


def full_prediction(
    logits: torch.Tensor,
    response: torch.Tensor,
    block_x0: torch.Tensor,
    lo: int,
    *,
    cfg: SamplingConfig,
    noise: RowNoise,
    active: torch.Tensor,
    mask_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's clean prediction of the whole response and its confidences.

    Args:
        logits: [B, R, V] logits of every response position (`response_logits`).
        response: [B, R] the response canvas before the step's commit.
        block_x0: [B, n] the sampler's proposals for response columns [lo, lo + n).
        noise: the record stream (`record_noise`); active: [B] rows that took the step.

    Returns:
        x0: [B, R] long, the sampled token at masked positions (the sampler's own in the block),
        the canvas token elsewhere; confidence: [B, R] float32, softmax(filter(logits / T)) (T = 1 at
        T = 0) at each position's sampled token (at committed positions: a fresh sample's).
    """
    x0, probs, _ = propose(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, noise=noise,
                           active=active, mask_id=mask_id, keep_probs=True)
    assert probs is not None
    x0[:, lo:lo + block_x0.shape[1]] = block_x0
    conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    return torch.where(response == mask_id, x0, response), conf


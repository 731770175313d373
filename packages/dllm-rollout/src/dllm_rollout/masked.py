"""Masked-diffusion decoding: LLaDA low-confidence / random remasking in semi-AR blocks.

Nie et al., "Large Language Diffusion Models" (arXiv 2502.09992), Algorithm 5 (low-confidence
remasking), and Fast-dLLM's confidence-threshold parallel decoding (Wu et al., arXiv 2505.22618).
"""

from __future__ import annotations

import torch

from dllm_rollout.config import SamplingConfig


def transfer_quota(num_masked: int, steps: int) -> list[int]:
    """Tokens to commit at each of `steps` steps: base m // steps, the first m % steps get one more."""
    base, extra = divmod(num_masked, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def _propose(
    logits: torch.Tensor, temperature: float, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposed tokens [B, N] and their log-prob under softmax(logits / T) (T=1 when T=0)."""
    logits32 = logits.float()
    if temperature == 0.0:
        x0 = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits32, dim=-1)
    else:
        scaled = logits32 / temperature
        noise = torch.stack(
            [torch.rand(scaled.shape[1:], generator=g, device=scaled.device) for g in generators]
        )
        gumbel = -torch.log(-torch.log(noise.clamp_min(1e-20)).clamp_min(1e-20))
        x0 = (scaled + gumbel).argmax(dim=-1)
        logp = torch.log_softmax(scaled, dim=-1)
    return x0, logp.gather(-1, x0[..., None]).squeeze(-1)


def _confidence(
    logits: torch.Tensor, x0: torch.Tensor, remasking: str, generators: list[torch.Generator]
) -> torch.Tensor:
    if remasking == "low_confidence":
        probs = torch.softmax(logits.float(), dim=-1)
        return probs.gather(-1, x0[..., None]).squeeze(-1)
    return torch.stack([torch.rand(x0.shape[1:], generator=g, device=x0.device) for g in generators])


def _select(conf: torch.Tensor, still_masked: torch.Tensor, k: int, threshold: float | None) -> torch.Tensor:
    """Positions [B, N] to commit: top-k by confidence, or all >= threshold (at least one)."""
    conf = conf.masked_fill(~still_masked, float("-inf"))
    if threshold is None:
        if k == 0:
            return torch.zeros_like(still_masked)
        idx = conf.topk(k, dim=-1).indices
        chosen = torch.zeros_like(still_masked).scatter_(1, idx, True)
        return chosen & still_masked
    chosen = (conf >= threshold) & still_masked
    best = torch.zeros_like(still_masked).scatter_(1, conf.argmax(dim=-1, keepdim=True), True)
    return (chosen | best) & still_masked

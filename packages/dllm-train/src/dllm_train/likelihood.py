"""Running a model on noised copies and reading aligned token log-probs."""

from __future__ import annotations

from typing import Any

import torch

from dllm_objectives import MaskPlan, apply_mask, token_logp_from_logits


def noised_token_logp(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, plan: MaskPlan
) -> torch.Tensor:
    """Log-prob of each clean token given each noised copy.

    Args:
        model: a dllm_models family module.
        input_ids: [B, L] clean tokens.
        attention_mask: [B, L] bool, real tokens.
        plan: mask plan with mask [B, N, L].

    Returns:
        float32 [B, N, L]: log p(x_j | z) read at the family's logit alignment.
    """
    b, n, seq = plan.mask.shape
    noisy = apply_mask(input_ids, plan, model.traits.mask_token_id).reshape(b * n, seq)
    attn = attention_mask.repeat_interleave(n, dim=0)
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(noisy, attention_mask=attn, position_ids=pos).logits
    if model.traits.logit_shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    targets = input_ids.repeat_interleave(n, dim=0)
    return token_logp_from_logits(logits, targets).reshape(b, n, seq)

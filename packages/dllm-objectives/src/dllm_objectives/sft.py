"""Masked-diffusion SFT negative ELBO for MDLM and block (BD3LM) models (docs/algorithms.md#sft)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_same_shape

__all__ = ["SFT_NORMALIZERS", "mdm_sft_loss"]

SFT_NORMALIZERS = ("response", "masked", "answer_len")


def mdm_sft_loss(
    token_logp: Tensor,
    mask: Tensor,
    t: Tensor,
    *,
    normalizer: str = "response",
    response_mask: Tensor | None = None,
    weight_by_t: bool = True,
) -> Tensor:
    """Masked-diffusion SFT loss ``-sum_{j in S_t} w log p(o_j | z_t) / Z`` (LLaDA, arXiv 2502.09992).

    ``w = 1 / t`` (``weight_by_t=True``, canonical) or 1 (LLaDA2). Normalisers ``Z``:

    * ``"response"`` (canonical, LLaDA paper): each sequence's sum is divided by its response
      length ``L_b`` (``response_mask.sum(-1)``), then averaged over sequences.
    * ``"masked"`` (LLaDA/Dream/LLaDA2 trainers): batch sum / number of masked tokens in the
      batch (with ``1 / t`` this is an effective ``1 / t^2`` weight, docs/algorithms.md#quirk-sft-normaliser).
    * ``"answer_len"`` (SDAR block SFT): batch sum / number of response tokens in the batch.

    For block models (SDAR, LLaDA2) pass the noisy-half log-probs of the BD3LM ``[z; x]``
    forward with one ``t`` per sample: the loss is the same.

    Args:
        token_logp: ``[B, L]`` log-probs of the clean tokens given the noisy input.
        mask: bool ``[B, L]``, masked (noised) positions; only these enter the loss.
        t: ``[B]`` (or ``[B, 1]``) masking ratio per sequence (> 0 when ``weight_by_t``).
        normalizer: one of :data:`SFT_NORMALIZERS`.
        response_mask: bool ``[B, L]`` response positions (default: every position).
        weight_by_t: multiply each term by ``1 / t``.

    Returns:
        float32 scalar loss.
    """
    check_choice("normalizer", normalizer, SFT_NORMALIZERS)
    check_bool("mask", mask, 2)
    check_same_shape(token_logp=token_logp, mask=mask)
    resp = torch.ones_like(mask) if response_mask is None else response_mask
    check_same_shape(token_logp=token_logp, response_mask=resp)
    tt = t.float().reshape(-1, 1)
    if tt.shape[0] != mask.shape[0]:
        raise ValueError(f"t must have shape [B] = [{mask.shape[0]}], got {tuple(t.shape)}.")
    if weight_by_t and bool((tt <= 0).any()):
        raise ValueError("t must be > 0 when weight_by_t=True; sample t with iid_masks(eps=1e-3).")
    lp = torch.where(mask, token_logp.float(), torch.zeros_like(token_logp, dtype=torch.float32))
    nll = -(lp / tt if weight_by_t else lp)
    if normalizer == "response":
        per_seq = nll.sum(-1) / resp.float().sum(-1).clamp_min(1)
        return per_seq.mean()
    denom = mask.float().sum() if normalizer == "masked" else resp.float().sum()
    return nll.sum() / denom.clamp_min(1)

"""Running a model on noised inputs and reading aligned token log-probs.

`Scorer` is the one place that knows how a family is run for a likelihood: the logit shift
(Dream reads position j's logit at j - 1) and, for block-diffusion families (SDAR, LLaDA2), the
BD3LM [x_t ; x_0] layout (Arriola et al., arXiv 2503.09573): a noisy block sees itself and the
clean earlier blocks only. Objectives receive a `Scorer` and never branch on the family.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_objectives import MaskPlan, apply_mask, token_logp_from_logits


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] position ids counted from each row's first real token (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _gather_logp(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 log-probs of `targets` ([M, S] or [M, S, C]) under logits [M, S, V]."""
    if targets.dim() == logits.dim() - 1:
        return token_logp_from_logits(logits, targets, temperature=temperature)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets)


class Scorer:
    """`score(noisy_ids, attention_mask, targets) -> token_logp` for one model.

    Attributes:
        model: a dllm_models family module.
        mask_id, eos_id, pad_id: the family's special token ids.
        block_length: block size of block-diffusion families (None: bidirectional masked LM).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        traits = model.traits
        self.mask_id: int = int(traits.mask_token_id)
        self.eos_id: int = int(traits.eos_token_id)
        self.pad_id: int = int(traits.pad_token_id)
        self.block_length: int | None = traits.block_length
        self.logit_shift: int = int(traits.logit_shift or 0)

    def _logits(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(ids, attention_mask=attn, position_ids=pos).logits
        if self.logit_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def __call__(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        *,
        clean_ids: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-prob of `targets` at every position given the noisy input.

        Args:
            noisy_ids: [M, S] model input (mask id at noised positions).
            attention_mask: [M, S] bool, real tokens.
            targets: [M, S] (or [M, S, C] candidate tokens) to score.
            clean_ids: [M, S] clean context of block models (default `targets`).
            temperature: divides the logits (1 for every learner but the exact-order AR one).

        Returns:
            float32 [M, S] (or [M, S, C]). Block models: 0 in blocks that hold no noised token.
        """
        attn = attention_mask.bool()
        pos = positions(attn)
        if self.block_length is None:
            return _gather_logp(self._logits(noisy_ids, attn, pos), targets, temperature)
        clean = targets if clean_ids is None else clean_ids
        return self._bd3lm(noisy_ids, attn, pos, clean, targets, temperature)

    def _bd3lm(self, noisy: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, clean: torch.Tensor,
               targets: torch.Tensor, temperature: float) -> torch.Tensor:
        """BD3LM likelihood with the model's own block-causal attention.

        For each block b holding a noised token, one row [x_0 of blocks < b ; x_t of block b]
        (later positions masked out as keys): under block-causal attention on the global grid
        the noisy block then sees exactly itself and the clean earlier blocks, i.e. the BD3LM
        visibility (`dllm_objectives.bd3lm_visible`), row by row.
        """
        assert self.block_length is not None
        bid = torch.where(attn, torch.div(pos, self.block_length, rounding_mode="floor"), -1)
        changed = (noisy != clean) & attn
        out = torch.zeros(targets.shape, dtype=torch.float32, device=noisy.device)
        blocks = torch.unique(bid[changed]).tolist()
        if not blocks:
            return out
        rows, row_attn = [], []
        for b in blocks:
            rows.append(torch.where(bid < b, clean, noisy))
            row_attn.append(attn & (bid <= b))
        m = noisy.shape[0]
        ids_all = torch.cat(rows)
        attn_all = torch.cat(row_attn)
        pos_all = pos.repeat(len(blocks), 1)
        tgt_all = targets.repeat(len(blocks), *([1] * (targets.dim() - 1)))
        logp = _gather_logp(self._logits(ids_all, attn_all, pos_all), tgt_all, temperature)
        for i, b in enumerate(blocks):
            sel = bid == b
            if targets.dim() == 3:
                sel = sel[..., None].expand_as(out)
            out = torch.where(sel, logp[i * m:(i + 1) * m], out)
        return out


def plan_token_logp(scorer: Scorer, input_ids: torch.Tensor, attention_mask: torch.Tensor, plan: MaskPlan,
                    *, temperature: float = 1.0, sample: int | None = None) -> torch.Tensor:
    """Log-prob of each clean token given each noised copy of a plan.

    Args:
        scorer: the model's scorer.
        input_ids: [B, S] clean tokens.
        attention_mask: [B, S] bool, real tokens.
        plan: mask plan with mask [B, N, S].
        temperature: learner temperature.
        sample: score only copy `sample` (returns [B, 1, S]).

    Returns:
        float32 [B, N, S] (or [B, 1, S]).
    """
    noisy = apply_mask(input_ids, plan, scorer.mask_id)
    if sample is not None:
        noisy = noisy[:, sample:sample + 1]
    b, n, s = noisy.shape
    attn = attention_mask.bool().repeat_interleave(n, dim=0)
    clean = input_ids.repeat_interleave(n, dim=0)
    lp = scorer(noisy.reshape(b * n, s), attn, clean, temperature=temperature)
    return lp.reshape(b, n, s)


def noised_token_logp(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, plan: MaskPlan
) -> torch.Tensor:
    """Log-prob of each clean token given each noised copy ([B, N, L] float32), any family."""
    return plan_token_logp(Scorer(model), input_ids, attention_mask, plan)

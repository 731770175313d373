"""Rollout-to-trainer consistency: replay a recorded trajectory and compare per-step log-probs."""

from __future__ import annotations

from typing import Any

import torch
from dllm_models.layers import positions_from_mask

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.block import grid_canvas
from dllm_rollout.editing import EDITS
from dllm_rollout.masked import full_logits


@torch.no_grad()
def consistency_gap(model: Any, batch: RolloutBatch) -> dict[str, float]:
    """Compare the rollout's per-step log-probs with a no-cache replay of its trajectory.

    For every step s, the canvas before step s is rebuilt from `unmask_step` (tokens committed at
    steps < s are present, the rest masked), the model is run on it without any cache (block
    diffusion: on the whole canvas with its block-causal mask), and the log-prob of each token
    committed at step s under softmax(logits / T) is compared with `batch.step_logp`.

    Exact decoders (masked diffusion without cache, block diffusion with or without its KV cache)
    agree to floating-point rounding; Fast-dLLM prefix/dual caches report their approximation gap.
    Rows with token edits (`extras["num_edits"] > 0`) cannot be replayed and raise ValueError.

    Args:
        model: the policy that produced the batch (or the trainer's copy of it).
        batch: a RolloutBatch from `generate(..., record_trajectory=True)`.

    Returns:
        {"max_abs_gap", "mean_abs_gap", "num_tokens", "num_steps"} (floats).
    """
    cfg = batch.config
    if cfg is None or batch.unmask_step is None or batch.step_logp is None:
        raise ValueError(
            "consistency_gap needs batch.config, unmask_step and step_logp: "
            "generate with record_trajectory=True"
        )
    edits = batch.extras.get(EDITS)
    if edits is not None and bool((edits > 0).any()):
        rows = torch.nonzero(edits > 0).flatten().tolist()
        raise ValueError(
            f"rows {rows} of the batch were decoded with token edits (extras['{EDITS}']): a step "
            "replay from unmask_step cannot rebuild their canvases; select the rows without edits "
            f"(batch.select(batch.extras['{EDITS}'] == 0)) or decode with editing_threshold=None"
        )
    traits = model.traits
    t = cfg.temperature if cfg.temperature > 0 else 1.0
    canvas, attn, pos, lo, tokens, steps, scored, rollout_logp = _replay_layout(model, batch)
    num_steps = int(steps.max().item()) + 1
    gaps: list[torch.Tensor] = []
    for s in range(num_steps):
        now = (steps == s) & scored
        if not bool(now.any()):
            continue
        visible = (steps == ALWAYS) | ((steps >= 0) & (steps < s))
        state = canvas.clone()
        state[:, lo:] = torch.where(visible, tokens, traits.mask_token_id)
        logits = full_logits(model, state, attn, pos)[:, lo:].float()
        logp = torch.log_softmax(logits / t, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
        gaps.append((logp - rollout_logp)[now].abs())
    gap = torch.cat(gaps) if gaps else torch.zeros(0)
    return {
        "max_abs_gap": float(gap.max().item()) if gap.numel() else 0.0,
        "mean_abs_gap": float(gap.mean().item()) if gap.numel() else 0.0,
        "num_tokens": float(gap.numel()),
        "num_steps": float(num_steps),
    }


ALWAYS = -2


def _replay_layout(model: Any, batch: RolloutBatch) -> tuple[Any, ...]:
    """Canvas/attn/pos [B, C], region start, region tokens/steps/scored/log-probs [B, W].

    steps: the step a region token was committed at; -1 never committed; ALWAYS (prompt tail in
    the first block) always visible. scored: response tokens (not the terminal-block tail).
    """
    cfg = batch.config
    assert cfg is not None and batch.unmask_step is not None and batch.step_logp is not None
    traits = model.traits
    b, p = batch.prompt_ids.shape
    r = cfg.max_new_tokens
    device = batch.prompt_ids.device
    if not cfg.block_diffusion:
        canvas = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
        attn = torch.cat([batch.prompt_mask, torch.ones((b, r), dtype=torch.bool, device=device)], dim=1)
        pos = positions_from_mask(attn)
        scored = torch.ones_like(batch.unmask_step, dtype=torch.bool)
        return canvas, attn, pos, p, batch.response_ids, batch.unmask_step, scored, batch.step_logp
    canvas, attn, pos, lo, offsets = grid_canvas(
        batch.prompt_ids, batch.prompt_mask, cfg.block_length, r, traits.mask_token_id, traits.pad_token_id
    )
    width = canvas.shape[1] - lo
    tokens = canvas[:, lo:].clone()
    steps = torch.full((b, width), ALWAYS, dtype=torch.long, device=device)
    scored = torch.zeros((b, width), dtype=torch.bool, device=device)
    logp = torch.zeros((b, width), dtype=torch.float32, device=device)
    tail, tail_steps = batch.extras["tail_ids"], batch.extras["tail_unmask_step"]
    for row, o in enumerate(offsets.tolist()):
        n = width - o - r
        tokens[row, o:o + r] = batch.response_ids[row]
        tokens[row, o + r:] = tail[row, :n]
        steps[row, o:o + r] = batch.unmask_step[row]
        steps[row, o + r:] = tail_steps[row, :n]
        scored[row, o:o + r] = True
        logp[row, o:o + r] = batch.step_logp[row]
    return canvas, attn, pos, lo, tokens, steps, scored, logp

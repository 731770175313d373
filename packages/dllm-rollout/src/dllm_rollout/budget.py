"""Response budgets aligned to the global block grid (block diffusion; DARE's trajectory-replay rollouts).

A block-diffusion model denoises whole blocks of the global grid (the prompt's first real token
at position 0). When `prompt_length + max_new_tokens` falls inside a block, the length cut ends
the response in the middle of a block whose other tokens were denoised with it. DARE's trajectory-replay
rollout shortens each request's budget to the last block boundary instead
(`align_cj_max_new_tokens`, verl/workers/rollout/cj_trajectory.py:108-138 at 83ae8a3), so a
response ends on the grid or at a stop token inside its terminal block.
"""

from __future__ import annotations

import dataclasses

import torch

from dllm_rollout.batch import RolloutBatch


def aligned_budgets(prompt_lengths: torch.Tensor, max_new_tokens: int, block_length: int) -> torch.Tensor:
    """Per-row budgets [B] long: ``max_new_tokens - (P_b + max_new_tokens) % block_length``.

    Args:
        prompt_lengths: [B] real prompt tokens per row.
    """
    return max_new_tokens - (prompt_lengths.long() + max_new_tokens) % block_length


def align_to_block_grid(batch: RolloutBatch) -> RolloutBatch:
    """`batch` with each row's counted response cut at its aligned budget (`aligned_budgets`).

    Block diffusion is block-causal, so the blocks before the cut were decoded exactly as if the
    budget had been the aligned one; the columns after it keep their tokens and records but are
    not counted (`response_mask`), so rewards and losses never see them.
    """
    cfg = batch.config
    if cfg is None or not cfg.block_diffusion:
        raise ValueError("align_to_block_grid: a block-diffusion RolloutBatch (config.block_diffusion=True) is needed")
    r = batch.response_ids.shape[1]
    budget = aligned_budgets(batch.prompt_mask.sum(-1), cfg.max_new_tokens, cfg.block_length)
    inside = torch.arange(r, device=budget.device)[None] < budget[:, None]
    return dataclasses.replace(batch, response_mask=batch.response_mask & inside)

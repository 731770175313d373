"""Engine outputs (lists of token ids) -> RolloutBatch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dllm_rollout.batch import RolloutBatch, response_mask
from dllm_rollout.config import SamplingConfig
from dllm_rollout.prompts import left_pad


def batch_from_token_lists(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    seeds: torch.Tensor,
    cfg: SamplingConfig,
    *,
    eos_id: int,
    pad_id: int,
    unmask_steps: Sequence[Sequence[int]] | None = None,
) -> RolloutBatch:
    """Left-pad prompts, right-pad responses to `cfg.max_new_tokens` with `pad_id`.

    Engines stop at EOS, so the response mask always counts tokens through the first EOS
    (docs/generation.md#rollout-output), whatever `cfg.eos_handling` says.

    Args:
        prompts, responses: B lists of token ids (responses longer than R are cut).
        unmask_steps: optional 0-based step per response token (engine step maps).
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} engine outputs")
    ids, mask = left_pad(prompts, pad_id)
    r = cfg.max_new_tokens
    resp = torch.full((len(responses), r), pad_id, dtype=torch.long)
    filled = torch.zeros((len(responses), r), dtype=torch.bool)
    steps = torch.full((len(responses), r), -1, dtype=torch.long) if unmask_steps is not None else None
    for i, toks in enumerate(responses):
        n = min(len(toks), r)
        resp[i, :n] = torch.as_tensor(list(toks)[:n], dtype=torch.long)
        filled[i, :n] = True
        if steps is not None and unmask_steps is not None:
            steps[i, :n] = torch.as_tensor(list(unmask_steps[i])[:n], dtype=torch.long)
    return RolloutBatch(
        prompt_ids=ids,
        prompt_mask=mask,
        response_ids=resp,
        response_mask=response_mask(resp, eos_id, "truncate") & filled,
        seeds=seeds,
        unmask_step=steps,
        config=cfg,
    )

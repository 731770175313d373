"""The response positions CJ-GRPO replays: the counted response, and on block models the rest of
its terminal block.

A block-diffusion rollout denoises its terminal block (the one holding the stop token, or the
last one) completely: the tokens after the stop inside that block were sampled with the others and
were the context of every step of the block. DARE replays them as context and as latent actions of
the same outcome (yjyddq/DARE 5f8e5f0, "replay complete terminal diffusion blocks";
`build_cj_replay_model_inputs` and `expand_cj_outcome_values_to_replay` in
verl/workers/actor/block_diffusion_utils.py at 83ae8a3); docs/algorithms.md#cj-grpo.
"""

from __future__ import annotations

import torch

from dllm_rollout import RolloutBatch

from dllm_algorithms.scoring import is_block


def replay_response(rollout: RolloutBatch) -> torch.Tensor:
    """[B, R] bool: the response positions of CJ-GRPO's replay view.

    Masked models: the counted response (`response_mask`). Block models: the counted response (its
    decoded part: with `eos_handling="keep"` and `stop_at_eos` the blocks after the stop are filled,
    never decoded, and not replayed) extended through the end of its terminal block on the global grid (block ids counted from
    the first real prompt token), up to the response's last column; a row without counted tokens
    replays nothing. With DARE's budgets (`SamplingConfig.block_aligned_budget`, which the block
    CJ-GRPO recipes set) every terminal block ends inside the response; without them a block cut
    by the length budget is replayed up to the response's end (its decoded rest is not kept).

    Raises:
        ValueError: a replayed position has no recorded unmask step.
    """
    counted = rollout.response_mask
    if not is_block(rollout):
        return counted
    assert rollout.config is not None and rollout.unmask_step is not None
    bl, r = rollout.config.block_length, counted.shape[1]
    n = counted.long().cumprod(-1).sum(-1)  # length of the counted prefix
    if not torch.equal(counted, torch.arange(r, device=n.device)[None] < n[:, None]):
        raise ValueError("CJ-GRPO replay: rollout.response_mask must be a prefix of each response")
    # eos_handling="keep" with stop_at_eos: the blocks after a row's stop were filled, never decoded
    # (no unmask step), so they are no actions: the replay ends with the last decoded block
    n = torch.minimum(n, (rollout.unmask_step >= 0).long().cumprod(-1).sum(-1))
    plen = rollout.prompt_mask.long().sum(-1)
    end = torch.where(n > 0, (plen + n + bl - 1) // bl * bl - plen, 0).clamp(max=r)  # terminal block's end
    replay = torch.arange(r, device=n.device)[None] < end[:, None]
    if bool((replay & (rollout.unmask_step < 0)).any()):
        raise ValueError("CJ-GRPO replay: a position of a terminal block has no recorded unmask step "
                         "(record_trajectory=True decodes every block completely)")
    return replay

"""Block-grid-aligned response budgets against DARE's `align_cj_max_new_tokens`
(yjyddq/DARE at 83ae8a3, verl/workers/rollout/cj_trajectory.py:108-138)."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import SamplingConfig, generate
from dllm_rollout.budget import aligned_budgets

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22], [30, 31, 32, 33]]


def _dare_align_cj_max_new_tokens(prompt_lengths: list[int], max_new_tokens: int, block_size: int) -> list[int]:
    # DARE: verl/workers/rollout/cj_trajectory.py:126-138 (validation of the inputs left out)
    aligned_max_new_tokens = []
    for prompt_length in prompt_lengths:
        aligned = max_new_tokens - ((prompt_length + max_new_tokens) % block_size)
        if aligned <= 0:
            raise ValueError("No positive global-block-aligned CJ generation budget exists")
        aligned_max_new_tokens.append(aligned)
    return aligned_max_new_tokens


@pytest.mark.parametrize(("max_new_tokens", "block_size"), [(7, 4), (8, 4), (2048, 4), (2048, 32), (33, 32)])
def test_aligned_budgets_equal_dare(max_new_tokens: int, block_size: int) -> None:
    lengths = list(range(0, 70))
    ours = aligned_budgets(torch.tensor(lengths), max_new_tokens, block_size).tolist()
    assert ours == _dare_align_cj_max_new_tokens(lengths, max_new_tokens, block_size)
    assert all((p + a) % block_size == 0 for p, a in zip(lengths, ours))


def test_aligned_decoding_cuts_counted_responses_at_the_grid() -> None:
    from tests.dllm_rollout.conftest import tiny

    model = tiny("sdar")  # block 4
    eos = int(model.traits.eos_token_id)  # type: ignore[union-attr]
    cfg = dict(max_new_tokens=10, steps=4, block_length=4, temperature=1.0, seed=1, eos_handling="truncate")
    plain = generate(model, PROMPTS, **cfg)
    aligned = generate(model, PROMPTS, block_aligned_budget=True, **cfg)
    # block-causal decoding: the blocks before the cut are decoded the same
    assert torch.equal(aligned.response_ids, plain.response_ids)
    budget = aligned_budgets(torch.tensor([len(p) for p in PROMPTS]), 10, 4)
    inside = torch.arange(10)[None] < budget[:, None]
    assert torch.equal(aligned.response_mask, plain.response_mask & inside)
    assert not torch.equal(aligned.response_mask, plain.response_mask)  # some row was cut
    for row, prompt in enumerate(PROMPTS):
        n = int(aligned.response_mask[row].sum())
        ends_on_grid = (len(prompt) + n) % 4 == 0
        assert ends_on_grid or int(aligned.response_ids[row, n - 1]) == eos


def test_aligned_budget_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="block_aligned_budget=True is a block-diffusion setting"):
        SamplingConfig(max_new_tokens=8, steps=8, block_length=4, block_aligned_budget=True)
    with pytest.raises(ValueError, match="max_new_tokens >= block_length"):
        SamplingConfig(max_new_tokens=3, steps=4, block_length=4, block_aligned_budget=True, block_diffusion=True)

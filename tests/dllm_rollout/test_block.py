"""Block diffusion (SDAR, LLaDA2): global grid, exact KV cache, dynamic unmasking, EOS, replay."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import consistency_gap, generate
from dllm_rollout.block import grid_canvas

# lengths 5, 10, 3 with block 4: prompt tails of 1, 2 and 3 tokens share the first decode block
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]


def test_grid_layout_aligns_blocks_to_position_zero() -> None:
    ids = torch.tensor([[0, 0, 0, 0, 0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    mask = torch.tensor([[False] * 5 + [True] * 5, [True] * 10])
    canvas, attn, pos, start, offsets = grid_canvas(ids, mask, 4, 6, mask_id=63, pad_id=62)
    # row 0 has 1 full prompt block, row 1 has 2: row 0 is padded by one block
    assert start == 8 and offsets.tolist() == [1, 2]
    assert canvas[0, :4].tolist() == [62] * 4 and canvas[0, 4:9].tolist() == [1, 2, 3, 4, 5]
    assert canvas[1, :10].tolist() == list(range(7, 17))
    assert bool((pos[attn] // 4 == torch.arange(canvas.shape[1]).expand(2, -1)[attn] // 4 - torch.tensor([[1], [0]]).expand(2, canvas.shape[1])[attn]).all())
    # 8 + 3 blocks of 4: row 1 needs (2 + 6) / 4 = 2 decode blocks, row 0 (1 + 6) / 4 -> 2
    assert canvas.shape[1] == 16


@pytest.mark.parametrize("kwargs", [
    {},
    {"threshold": 0.3},
    {"temperature": 1.0, "top_k": 8, "top_p": 0.9, "steps": 2},
])
def test_kv_cache_equals_recompute_token_for_token(tiny_block_model: torch.nn.Module, kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"max_new_tokens": 10, "steps": 4, "block_length": 4, "seed": 7,
                               "stop_at_eos": False, "record_trajectory": True}
    args.update(kwargs)
    ref = generate(tiny_block_model, PROMPTS, cache=None, **args)  # type: ignore[arg-type]
    got = generate(tiny_block_model, PROMPTS, cache="prefix", **args)  # type: ignore[arg-type]
    assert torch.equal(ref.response_ids, got.response_ids)
    assert ref.unmask_step is not None and got.unmask_step is not None
    assert torch.equal(ref.unmask_step, got.unmask_step)
    assert ref.step_logp is not None and got.step_logp is not None
    torch.testing.assert_close(ref.step_logp, got.step_logp, rtol=0, atol=1e-5)
    for batch in (ref, got):
        assert consistency_gap(tiny_block_model, batch)["max_abs_gap"] < 1e-5


def test_prompt_tail_shares_first_block(tiny_block_model: torch.nn.Module) -> None:
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=4, block_length=4, stop_at_eos=False,
                   record_trajectory=True)
    assert out.unmask_step is not None
    # static: one token per step; the first block holds 3, 2 and 1 masks after the prompt tails
    first_block = [3, 2, 1]
    for row, n in enumerate(first_block):
        assert sorted(out.unmask_step[row, :n].tolist()) == list(range(n))
        assert int(out.unmask_step[row, n:].min()) == n


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_dynamic_threshold_never_stalls(tiny_block_model: torch.nn.Module, threshold: float) -> None:
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=4, block_length=4, threshold=threshold,
                   stop_at_eos=False, cache="prefix")
    assert not bool((out.response_ids == tiny_block_model.traits.mask_token_id).any())  # type: ignore[union-attr]


def test_eos_stops_a_row_after_its_block(tiny_block_model: torch.nn.Module) -> None:
    eos = tiny_block_model.traits.eos_token_id  # type: ignore[union-attr]
    free = generate(tiny_block_model, PROMPTS, max_new_tokens=24, steps=4, block_length=4, temperature=1.0,
                    seed=1, stop_at_eos=False)
    stop = generate(tiny_block_model, PROMPTS, max_new_tokens=24, steps=4, block_length=4, temperature=1.0,
                    seed=1, eos_handling="truncate")
    for row in range(len(PROMPTS)):
        hits = (free.response_ids[row] == eos).nonzero().flatten().tolist()
        if not hits:
            assert torch.equal(free.response_ids[row], stop.response_ids[row])
            continue
        first = hits[0]
        assert torch.equal(free.response_ids[row, : first + 1], stop.response_ids[row, : first + 1])
        assert int(stop.response_mask[row].sum()) == first + 1


@pytest.mark.parametrize("kwargs", [{"temperature": 1.0}, {"temperature": 1.0, "threshold": 0.2}])
def test_block_sample_replays_alone(tiny_block_model: torch.nn.Module, kwargs: dict[str, object]) -> None:
    batch = generate(tiny_block_model, PROMPTS, max_new_tokens=9, steps=4, block_length=4, seed=3,
                     cache="prefix", **kwargs)  # type: ignore[arg-type]
    for i, prompt in enumerate(PROMPTS):
        alone = generate(tiny_block_model, [prompt], max_new_tokens=9, steps=4, block_length=4,
                         seed=[int(batch.seeds[i])], cache="prefix", **kwargs)  # type: ignore[arg-type]
        assert torch.equal(alone.response_ids[0], batch.response_ids[i])


def test_block_length_must_match_model(tiny_block_model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="block_length"):
        generate(tiny_block_model, PROMPTS, max_new_tokens=8, steps=4, block_length=8)

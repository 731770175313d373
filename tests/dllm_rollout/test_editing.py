"""Token editing (LLaDA2.1 joint-threshold decoding) against a plain per-row reference loop.

The algorithm: docs/generation.md#llada2.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dllm_rollout import SamplingConfig, consistency_gap, generate
from dllm_rollout.editing import edit_mask, editable, rows_to_step, still_open

# lengths 5, 10, 3 with block 4: prompt tails of 1, 2 and 3 tokens share the first decode block
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]
BL = 4


def reference_decode(model: torch.nn.Module, prompt: list[int], *, max_new_tokens: int, threshold: float,
                     editing_threshold: float | None, max_post_steps: int,
                     stop_at_eos: bool) -> tuple[list[int], int]:
    """Spec 2.5 for one row at T = 0, written out: plain lists, one full forward of [0, block end) per step.

    Confidence is softmax(fp32 logits) at the argmax, with the mask token excluded from the
    distribution (dllm_rollout never proposes the mask). Masks: commit those with confidence
    >= threshold, or the single most confident if none passes (lowest index on ties). Edits:
    filled response positions whose argmax differs with confidence > editing_threshold.

    Returns:
        (response tokens, number of edits).
    """
    traits = model.traits  # type: ignore[attr-defined]
    mask, eos = traits.mask_token_id, traits.eos_token_id
    p = len(prompt)
    total = -(-(p + max_new_tokens) // BL) * BL
    x = list(prompt) + [mask] * (total - p)
    edits = 0
    for start in range(p // BL * BL, total, BL):
        end = start + BL
        post = 0
        while True:
            masked = [j for j in range(start, end) if x[j] == mask]
            if not masked:
                post += 1
                if post > max_post_steps:
                    break
            logits = model(torch.tensor([x[:end]])).logits[0].float().detach()
            tok, conf = {}, {}
            for j in range(start, end):
                row = logits[j].clone()
                row[mask] = float("-inf")
                probs = torch.softmax(row, dim=-1)
                tok[j] = int(probs.argmax())
                conf[j] = float(probs[tok[j]])
            new = list(x)
            chosen = [j for j in masked if conf[j] >= threshold]
            if masked and not chosen:
                chosen = [max(masked, key=lambda j: conf[j])]  # max keeps the first of equal values
            for j in chosen:
                new[j] = tok[j]
            edited = []
            if editing_threshold is not None:
                edited = [j for j in range(max(start, p), end)
                          if x[j] != mask and tok[j] != x[j] and conf[j] > editing_threshold]
            for j in edited:
                new[j] = tok[j]
            x, edits = new, edits + len(edited)
            if not masked and not edited:
                break
        if stop_at_eos and eos in x[p:end]:
            break
    return [eos if t == mask else t for t in x[p:p + max_new_tokens]], edits


@pytest.mark.parametrize("cache", [None, "prefix"])
@pytest.mark.parametrize("threshold, editing_threshold, max_post_steps", [
    (0.3, 0.2, 16),  # a few edits per row
    (0.5, 0.0, 3),  # the tiny model keeps changing its mind: every block spends its post-fill budget
])
def test_matches_reference_loop(tiny_block_model: torch.nn.Module, cache: str | None, threshold: float,
                                editing_threshold: float, max_post_steps: int) -> None:
    kwargs = {"threshold": threshold, "editing_threshold": editing_threshold, "max_post_steps": max_post_steps}
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=BL, block_length=BL, cache=cache,
                   **kwargs)  # type: ignore[arg-type]
    total = 0
    for row, prompt in enumerate(PROMPTS):
        tokens, edits = reference_decode(tiny_block_model, prompt, max_new_tokens=10, stop_at_eos=True, **kwargs)
        assert out.response_ids[row].tolist() == tokens
        assert int(out.extras["num_edits"][row]) == edits
        total += edits
    assert total > 0  # the case really edits


def test_without_editing_matches_reference_loop(tiny_block_model: torch.nn.Module) -> None:
    # editing off: the dynamic-threshold decoder, no step after a block is filled
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=BL, block_length=BL, threshold=0.3)
    assert "num_edits" not in out.extras
    for row, prompt in enumerate(PROMPTS):
        tokens, _ = reference_decode(tiny_block_model, prompt, max_new_tokens=10, threshold=0.3,
                                     editing_threshold=None, max_post_steps=0, stop_at_eos=True)
        assert out.response_ids[row].tolist() == tokens


def test_edits_above_one_change_nothing(tiny_block_model: torch.nn.Module) -> None:
    # no confidence exceeds 1: same tokens as without editing, one extra (checking) step per block
    args = {"max_new_tokens": 10, "steps": BL, "block_length": BL, "threshold": 0.3, "stop_at_eos": False,
            "record_trajectory": True}
    plain = generate(tiny_block_model, PROMPTS, **args)  # type: ignore[arg-type]
    checked = generate(tiny_block_model, PROMPTS, editing_threshold=1.0, **args)  # type: ignore[arg-type]
    assert torch.equal(plain.response_ids, checked.response_ids)
    assert checked.extras["num_edits"].tolist() == [0, 0, 0]
    assert checked.unmask_step is not None and plain.unmask_step is not None
    assert bool((checked.unmask_step >= plain.unmask_step).all())
    # rows without edits replay exactly: the checking steps only leave gaps in the step numbers
    assert consistency_gap(tiny_block_model, checked)["max_abs_gap"] < 1e-5


@pytest.mark.parametrize("threshold, editing_threshold", [(1.0, 0.0), (0.0, 0.0), (1.0, 0.5)])
@pytest.mark.parametrize("max_post_steps", [0, 3, 16])
def test_never_stalls(tiny_block_model: torch.nn.Module, threshold: float, editing_threshold: float,
                      max_post_steps: int) -> None:
    widths: list[int] = []
    hook = tiny_block_model.register_forward_pre_hook(lambda _m, args: widths.append(int(args[0].shape[1])))
    try:
        out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=BL, block_length=BL, threshold=threshold,
                       editing_threshold=editing_threshold, max_post_steps=max_post_steps, stop_at_eos=False)
    finally:
        hook.remove()
    # cache=None runs one forward of [0, block end) per step: count the steps of each of the 4
    # decode blocks (region from column 8; row 2 needs (3 + 10) / 4 -> 4 blocks)
    per_block = Counter(widths)
    assert sorted(per_block) == [12, 16, 20, 24] and max(per_block.values()) <= BL + max_post_steps
    assert not bool((out.response_ids == tiny_block_model.traits.mask_token_id).any())  # type: ignore[union-attr]


@pytest.mark.parametrize("kwargs", [
    {"temperature": 1.0, "threshold": 0.3, "editing_threshold": 0.2},
    {"temperature": 0.8, "top_k": 8, "top_p": 0.9, "threshold": 0.5, "editing_threshold": 0.0, "max_post_steps": 4},
])
def test_cache_equals_recompute_and_seed_replays(tiny_block_model: torch.nn.Module, kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"max_new_tokens": 9, "steps": BL, "block_length": BL, "seed": 3,
                               "record_trajectory": True, **kwargs}
    ref = generate(tiny_block_model, PROMPTS, cache=None, **args)  # type: ignore[arg-type]
    got = generate(tiny_block_model, PROMPTS, cache="prefix", **args)  # type: ignore[arg-type]
    assert torch.equal(ref.response_ids, got.response_ids)
    assert torch.equal(ref.extras["num_edits"], got.extras["num_edits"])
    assert ref.unmask_step is not None and got.unmask_step is not None
    assert torch.equal(ref.unmask_step, got.unmask_step)
    assert ref.step_logp is not None and got.step_logp is not None
    torch.testing.assert_close(ref.step_logp, got.step_logp, rtol=0, atol=1e-5)
    assert int(got.extras["num_edits"].sum()) > 0
    again = generate(tiny_block_model, PROMPTS, cache="prefix", **args)  # type: ignore[arg-type]
    assert torch.equal(again.response_ids, got.response_ids) and torch.equal(again.step_logp, got.step_logp)  # type: ignore[arg-type]
    args.pop("seed")
    for i, prompt in enumerate(PROMPTS):
        alone = generate(tiny_block_model, [prompt], cache="prefix", seed=[int(got.seeds[i])], **args)  # type: ignore[arg-type]
        assert torch.equal(alone.response_ids[0], got.response_ids[i])
        assert torch.equal(alone.extras["num_edits"][0], got.extras["num_edits"][i])


def test_edited_tokens_record_their_last_write(tiny_block_model: torch.nn.Module) -> None:
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=BL, block_length=BL, threshold=0.3,
                   editing_threshold=0.2, stop_at_eos=False, record_trajectory=True, record_steps=True)
    assert out.unmask_step is not None and out.step_x0 is not None and out.step_canvas is not None
    assert int(out.extras["num_edits"].sum()) > 0
    for row in range(len(PROMPTS)):
        for col, step in enumerate(out.unmask_step[row].tolist()):
            token = int(out.response_ids[row, col])
            assert int(out.step_x0[row, step, col]) == token  # written at that step ...
            later = out.step_canvas[row, step + 1:, col]
            assert bool((later[later != tiny_block_model.traits.mask_token_id] == token).all())  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="token edits"):
        consistency_gap(tiny_block_model, out)


def test_rule_functions_by_hand() -> None:
    mask = 9
    block = torch.tensor([[5, mask, 6, 7], [mask, mask, 3, 4]])
    # block at region column 0; row 0's own span is [1, 8) (one prompt token first), row 1's [0, 3)
    cand = editable(block, mask, 0, (torch.tensor([1, 0]), torch.tensor([8, 3])))
    assert cand.tolist() == [[False, False, True, True], [False, False, True, False]]
    x0 = torch.tensor([[1, 2, 6, 8], [1, 2, 0, 0]])
    conf = torch.tensor([[0.9, 0.9, 0.9, 0.5], [0.9, 0.9, 0.4, 0.3]])
    # row 0: col 2 unchanged, col 3 changed with 0.5 > 0.4; row 1: col 2 has 0.4, not > 0.4
    assert edit_mask(x0, conf, block, cand, 0.4).tolist() == [[False, False, False, True],
                                                                [False, False, False, False]]
    # row 0 filled (1 post step taken, budget 1 -> the 2nd is refused), row 1 has masks, row 2 closed
    active, post = rows_to_step(torch.tensor([True, True, False]), torch.tensor([False, True, False]),
                                torch.tensor([1, 0, 0]), 1)
    assert active.tolist() == [False, True, False] and post.tolist() == [2, 0, 0]
    edits = torch.tensor([[False, True], [False, False], [False, False]])
    assert still_open(torch.tensor([True, True, True]), torch.tensor([False, False, True]), edits).tolist() == [
        True, False, True]


def test_config_validation() -> None:
    base = {"max_new_tokens": 8, "steps": 4, "block_length": 4}
    with pytest.raises(ValueError, match="block-diffusion"):
        SamplingConfig(threshold=0.5, editing_threshold=0.5, **base)
    with pytest.raises(ValueError, match="needs threshold"):
        SamplingConfig(editing_threshold=0.5, block_diffusion=True, **base)
    with pytest.raises(ValueError, match="editing_threshold must be in"):
        SamplingConfig(threshold=0.5, editing_threshold=1.5, block_diffusion=True, **base)
    with pytest.raises(ValueError, match="max_post_steps"):
        SamplingConfig(max_post_steps=-1, block_diffusion=True, **base)

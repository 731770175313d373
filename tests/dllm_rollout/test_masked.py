"""Masked diffusion: LLaDA reference decoder, quota, caches, threshold, Dream algorithms, replay."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import consistency_gap, generate, transfer_quota

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16]]


def _llada_reference(model: torch.nn.Module, prompt: list[int], r: int, steps: int, bl: int) -> torch.Tensor:
    """Spec 2.1 written out for one prompt at T=0: quota per block, top-k of softmax confidence."""
    mask = model.traits.mask_token_id  # type: ignore[union-attr]
    x = torch.tensor([prompt + [mask] * r])
    p, spb = len(prompt), steps // (r // bl)
    for blk in range(r // bl):
        lo, hi = p + blk * bl, p + (blk + 1) * bl
        quota = [bl // spb + (1 if i < bl % spb else 0) for i in range(spb)]
        for k in quota:
            logits = model(x).logits
            logits[..., mask] = float("-inf")  # the decoder never proposes the mask token
            x0 = logits.argmax(-1)
            conf = torch.softmax(model(x).logits.float(), -1).gather(-1, x0[..., None])[..., 0]
            conf[:, :lo] = float("-inf")
            conf[:, hi:] = float("-inf")
            conf[x != mask] = float("-inf")
            idx = conf.topk(k, dim=-1).indices
            x[0, idx[0]] = x0[0, idx[0]]
    return x[0, p:]


def test_reference_decoder_matches_spec(tiny_llada: torch.nn.Module) -> None:
    out = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=8, block_length=8)
    for i, prompt in enumerate(PROMPTS):
        assert torch.equal(out.response_ids[i], _llada_reference(tiny_llada, prompt, 16, 8, 8))


def test_quota_matches_spec(tiny_llada: torch.nn.Module) -> None:
    # 16 tokens, 2 blocks of 8, 6 steps -> 3 steps per block; quota of 8 over 3 = [3, 3, 2]
    assert transfer_quota(8, 3) == [3, 3, 2]
    assert transfer_quota(8, 8) == [1] * 8
    out = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=6, block_length=8, record_trajectory=True)
    assert out.unmask_step is not None
    counts = [(out.unmask_step == s).sum(-1).tolist() for s in range(6)]
    assert counts == [[3, 3, 3], [3, 3, 3], [2, 2, 2]] * 2
    # each block is filled by its own steps only
    assert int(out.unmask_step[:, :8].max()) == 2 and int(out.unmask_step[:, 8:].min()) == 3


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_threshold_never_stalls(tiny_llada: torch.nn.Module, cache: str | None, threshold: float) -> None:
    out = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=2, block_length=4, cache=cache,
                   threshold=threshold, record_trajectory=True)
    mask = tiny_llada.traits.mask_token_id  # type: ignore[union-attr]
    assert not bool((out.response_ids == mask).any())
    assert out.unmask_step is not None
    per_row_steps = out.unmask_step.max(-1).values + 1
    assert bool((per_row_steps <= 8).all())  # at least one token per step
    if threshold == 1.0:  # nothing reaches probability 1 in this tiny model: exactly one per step
        assert per_row_steps.tolist() == [8, 8, 8]
    if threshold == 0.0:  # everything passes: one step per block
        assert per_row_steps.tolist() == [2, 2, 2]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_exact_with_one_step_per_block(tiny_llada: torch.nn.Module, cache: str) -> None:
    # every step is then the block's full forward: the caches are never read
    ref = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=4, block_length=4, threshold=0.0)
    got = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=4, block_length=4, threshold=0.0, cache=cache)
    assert torch.equal(ref.response_ids, got.response_ids)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_forward_is_exact_on_a_frozen_canvas(tiny_llada: torch.nn.Module, cache: str) -> None:
    # the cache mechanism itself: keys from the same canvas give the full forward's logits
    ids = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12)[None].expand(2, -1)
    full = tiny_llada(ids, position_ids=pos, use_cache=True)
    kv = full.past_key_values
    past = kv.slice(0, 6) if cache == "prefix" else kv.slice(0, 6).cat(kv.slice(9))
    hi = 12 if cache == "prefix" else 9
    part = tiny_llada(ids[:, 6:hi], position_ids=pos[:, 6:hi], past_key_values=past).logits
    torch.testing.assert_close(part, full.logits[:, 6:hi], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_fast_dllm_caches_are_approximate_and_report_their_gap(tiny_llada: torch.nn.Module, cache: str) -> None:
    exact = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=8, block_length=8, record_trajectory=True)
    approx = generate(tiny_llada, PROMPTS, max_new_tokens=16, steps=8, block_length=8, cache=cache,
                      record_trajectory=True)
    assert consistency_gap(tiny_llada, exact)["max_abs_gap"] < 1e-5
    gap = consistency_gap(tiny_llada, approx)
    assert gap["num_tokens"] == 48 and gap["max_abs_gap"] > 1e-3  # stale keys show up in the log-probs


@pytest.mark.parametrize("kwargs", [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.7, "top_p": 0.9, "remasking": "random"},
    {"temperature": 1.0, "threshold": 0.2, "cache": "prefix"},
    {"temperature": 1.0, "remasking": "entropy", "alg_temp": 0.5},
])
def test_sample_replays_alone(tiny_llada: torch.nn.Module, kwargs: dict[str, object]) -> None:
    batch = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=4, block_length=4, seed=11,
                     record_trajectory=True, **kwargs)  # type: ignore[arg-type]
    for i, prompt in enumerate(PROMPTS):
        alone = generate(tiny_llada, [prompt], max_new_tokens=8, steps=4, block_length=4,
                         seed=[int(batch.seeds[i])], record_trajectory=True, **kwargs)  # type: ignore[arg-type]
        assert torch.equal(alone.response_ids[0], batch.response_ids[i])
        assert batch.unmask_step is not None and alone.unmask_step is not None
        assert torch.equal(alone.unmask_step[0], batch.unmask_step[i])


def test_group_samples_differ(tiny_llada: torch.nn.Module) -> None:
    out = generate(tiny_llada, [PROMPTS[0]] * 4, max_new_tokens=8, steps=8, block_length=8,
                   temperature=1.0, seed=0)
    assert len({tuple(r) for r in out.response_ids.tolist()}) > 1


def test_top_k_one_is_greedy(tiny_llada: torch.nn.Module) -> None:
    greedy = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=4, block_length=4)
    topk1 = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=4, block_length=4, temperature=2.0,
                     top_k=1, seed=5)
    assert torch.equal(greedy.response_ids, topk1.response_ids)


def test_top_k_restricts_support(tiny_llada: torch.nn.Module) -> None:
    out = generate(tiny_llada, [PROMPTS[0]] * 8, max_new_tokens=8, steps=8, block_length=8,
                   temperature=1.0, top_k=3, seed=2, record_steps=True)
    # every committed token was among the 3 most likely proposals at its step
    x = torch.tensor([PROMPTS[0] + [tiny_llada.traits.mask_token_id] * 8] * 8)  # type: ignore[union-attr]
    assert out.step_canvas is not None
    for s in range(out.step_canvas.shape[1]):
        x[:, 5:] = out.step_canvas[:, s]
        logits = tiny_llada(x).logits[:, 5:]
        logits[..., tiny_llada.traits.mask_token_id] = float("-inf")  # type: ignore[union-attr]
        top3 = logits.topk(3, dim=-1).indices
        nxt = out.step_canvas[:, s + 1] if s + 1 < out.step_canvas.shape[1] else out.response_ids
        new = (nxt != x[:, 5:])
        assert bool((top3 == nxt[..., None]).any(-1)[new].all())


def test_trajectory_records_are_consistent(tiny_llada: torch.nn.Module) -> None:
    out = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=4, block_length=4, temperature=1.0, seed=3,
                   record_steps=True, record_trajectory=True, ref_model=tiny_llada)
    assert out.step_canvas is not None and out.step_x0 is not None and out.step_confidence is not None
    assert out.unmask_step is not None and out.ref_step_logp is not None and out.step_logp is not None
    assert out.step_canvas.shape == (3, 4, 8)
    mask = tiny_llada.traits.mask_token_id  # type: ignore[union-attr]
    for s in range(4):  # the canvas before step s holds exactly the tokens committed earlier
        expect = torch.where(out.unmask_step < s, out.response_ids, mask)
        assert torch.equal(out.step_canvas[:, s], expect)
        committed = out.unmask_step == s
        assert torch.equal(out.step_x0[:, s][committed], out.response_ids[committed])
    # the reference model is the policy itself here: identical log-probs
    torch.testing.assert_close(out.ref_step_logp, out.step_logp)


def test_logit_shift_reads_previous_position(tiny_llada: torch.nn.Module) -> None:
    shifted = generate(_with_shift(tiny_llada), PROMPTS[:1], max_new_tokens=4, steps=4, block_length=4)
    plain = generate(tiny_llada, PROMPTS[:1], max_new_tokens=4, steps=4, block_length=4)
    assert not torch.equal(shifted.response_ids, plain.response_ids)


def _with_shift(model: torch.nn.Module) -> torch.nn.Module:
    import copy
    import dataclasses

    m = copy.deepcopy(model)
    m.traits = dataclasses.replace(m.traits, logit_shift=1)  # type: ignore[arg-type]
    return m


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_shifted_caches_exact_with_one_step_per_block(tiny_llada: torch.nn.Module, cache: str) -> None:
    m = _with_shift(tiny_llada)
    # two steps per block: step 1 reads the cache; the shift needs position start - 1 in the window
    ref = generate(m, PROMPTS, max_new_tokens=8, steps=2, block_length=4, threshold=0.0)
    got = generate(m, PROMPTS, max_new_tokens=8, steps=2, block_length=4, threshold=0.0, cache=cache)
    assert torch.equal(ref.response_ids, got.response_ids)

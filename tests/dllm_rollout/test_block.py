"""Block diffusion (SDAR, LLaDA2): global grid, exact KV cache, dynamic unmasking, EOS, replay."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_rollout import SpeedConfig, consistency_gap, generate
from dllm_rollout.block import grid_canvas, grid_layout

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
    {"threshold": 0.05, "remasking": "low_confidence_dynamic", "temperature": 1.0, "top_k": 8},
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


def _forwards(model: torch.nn.Module) -> tuple[list[str], object]:
    """Record the model's forwards through a pre-hook: "pair" for a two-block forward (a KV cache
    with a key limit), else "one"."""
    kinds: list[str] = []

    def hook(_m: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        past = kwargs.get("past_key_values")
        kinds.append("pair" if getattr(past, "key_limit", None) is not None else "one")

    return kinds, model.register_forward_pre_hook(hook, with_kwargs=True)


def _decode_each(model: torch.nn.Module, prompts: list[list[int]], args: dict[str, object],
                 flag: str) -> tuple[dict[bool, object], dict[bool, list[str]]]:
    """`generate` with the speed switch `SpeedConfig.<flag>` off and on: the batches and the forwards' kinds."""
    out: dict[bool, object] = {}
    kinds: dict[bool, list[str]] = {}
    for on in (False, True):
        seen, handle = _forwards(model)
        out[on] = generate(model, prompts, speed=SpeedConfig(**{flag: on}), **args)  # type: ignore[arg-type]
        handle.remove()  # type: ignore[attr-defined]
        kinds[on] = seen
    return out, kinds


@pytest.mark.parametrize("prompts", [PROMPTS, [[1, 2], [3]]])  # the second: no full prompt block (r0 = 0)
@pytest.mark.parametrize("kwargs", [
    {},
    {"threshold": 0.3},
    {"temperature": 1.0, "top_k": 8, "steps": 2},
    {"threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 2},
])
def test_folded_store_pass_equals_separate_store_passes(
    tiny_block_model: torch.nn.Module, prompts: list[list[int]], kwargs: dict[str, object],
) -> None:
    """The store pass folded into the next block's first step: same tokens, same step log-probs (float64),
    one forward fewer per finished block, of two blocks' width."""
    if "editing_threshold" in kwargs and tiny_block_model.traits.family != "llada2":
        pytest.skip("editing is LLaDA2.1's decoding")
    model = tiny_block_model.double()
    args: dict[str, object] = {"max_new_tokens": 10, "steps": 4, "block_length": 4, "seed": 3,
                               "stop_at_eos": False, "record_trajectory": True, "cache": "prefix"}
    args.update(kwargs)
    batches, widths = _decode_each(model, prompts, args, "fold_store")
    out: dict[bool, Any] = batches
    assert torch.equal(out[False].response_ids, out[True].response_ids)
    assert out[False].step_logp is not None and out[True].step_logp is not None
    torch.testing.assert_close(out[False].step_logp, out[True].step_logp, rtol=0, atol=1e-10)
    assert "pair" not in widths[False]
    # each store pass after the cache exists is now half of the next block's first forward
    # (the first block's stays separate when no prompt block precedes it: it creates the cache)
    pairs = widths[True].count("pair")
    full, blocks, _ = grid_layout(torch.tensor([len(p) for p in prompts]), 4, 10)
    assert pairs == blocks - 1 - (full == 0) >= 1
    assert len(widths[False]) - len(widths[True]) == pairs


def test_folded_store_pass_is_block_causal(tiny_block_model: torch.nn.Module) -> None:
    """The finished block's queries in a two-block forward must not see the next block: changing the
    next block's tokens leaves the finished block's cached keys unchanged."""
    from dllm_models.protocol import KVCache
    from dllm_rollout.static_cache import StaticBlockCache

    model = tiny_block_model.double()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    pos = torch.arange(12)[None]
    cached = {}
    for nxt in ([13, 14, 15, 16], [30, 31, 32, 33]):
        canvas = ids.clone()
        canvas[0, 8:] = torch.tensor(nxt)
        pre = model(canvas[:, :4], position_ids=pos[:, :4], use_cache=True).past_key_values
        static = StaticBlockCache(pre, 1, 12, 4)
        static.store(0, pre)
        static.show_pair(4, 8, 12)
        assert isinstance(static.pair, KVCache)
        model(canvas[:, 4:12], position_ids=pos[:, 4:12], past_key_values=static.pair)
        cached[nxt[0]] = [k[:, :, 4:8].clone() for k in static.cache.keys]
        # the reference: the finished block [4, 8) alone against the prompt block
        ref = model(canvas[:, 4:8], position_ids=pos[:, 4:8], past_key_values=pre, use_cache=True).past_key_values
        for got, want in zip(cached[nxt[0]], ref.keys):
            torch.testing.assert_close(got, want[:, :, -4:], rtol=0, atol=1e-12)
    for a, b in zip(cached[13], cached[30]):
        assert torch.equal(a, b)


def test_a_pending_store_survives_a_block_without_steps(tiny_block_model: torch.nn.Module) -> None:
    """`finish` twice without a step between: the first block's store pass runs on its own, so its cached
    keys are those of a separate store pass."""
    from dllm_rollout.block import _CachedBlocks

    model = tiny_block_model.double()
    b, w, bl = 1, 16, 4
    canvas = torch.arange(5, 5 + w)[None].clone()
    attn = torch.ones(b, w, dtype=torch.bool)
    pos = torch.arange(w)[None]
    want = _CachedBlocks(model, canvas.clone(), attn, pos, 4, bl, SpeedConfig(fold_store=False))
    got = _CachedBlocks(model, canvas.clone(), attn, pos, 4, bl, SpeedConfig(fold_store=True))
    for cb in (want, got):
        cb.logits(4, 8)
        cb.canvas[0, 4:8] = torch.tensor([40, 41, 42, 43])  # the step's commits: the store must see them
        cb.finish(4, 8)
        cb.finish(8, 12)  # block [8, 12) took no step
        cb.logits(12, 16)
    assert want.static is not None and got.static is not None
    for a, c in zip(want.static.cache.keys, got.static.cache.keys):
        torch.testing.assert_close(a[:, :, 4:12], c[:, :, 4:12], rtol=0, atol=1e-12)


def _eos_that_splits_rows(model: torch.nn.Module, prompts: list[list[int]], args: dict[str, object]) -> int:
    """A token id that ends some rows early (in a finished block before the last) and not others, so
    that rows finish at different blocks: chosen from a run that ignores EOS (sampling never reads it)."""
    free = generate(model, prompts, **{**args, "stop_at_eos": False})  # type: ignore[arg-type]
    resp = free.response_ids.cpu()  # the GPU tests decode on CUDA
    blocks = -(-resp.shape[1] // 4)
    best, best_spread = -1, -1
    for tok in resp.unique().tolist():
        hit = resp == tok
        first = torch.where(hit.any(1), hit.float().argmax(1) // 4, torch.full((resp.shape[0],), blocks))
        early = int((first < blocks - 2).sum())  # rows that finish with at least two blocks to go
        spread = len(set(first.tolist()))
        if 2 <= early < resp.shape[0] and spread > best_spread:
            best, best_spread = int(tok), spread
    assert best >= 0, "no token splits the rows; change the seed"
    return best


def _stop_rows_apart(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module, prompts: list[list[int]],
                     args: dict[str, object]) -> None:
    """Make `_eos_that_splits_rows`' token the model's EOS for the test."""
    import dataclasses

    eos = _eos_that_splits_rows(model, prompts, args)
    monkeypatch.setattr(model, "traits", dataclasses.replace(model.traits, eos_token_id=eos))  # type: ignore[arg-type]


def _batch_sizes(model: torch.nn.Module) -> tuple[list[int], object]:
    """The rows of every forward of `model` from now on (and the hook's handle)."""
    sizes: list[int] = []

    def hook(_m: torch.nn.Module, args: tuple[torch.Tensor, ...], kwargs: dict[str, torch.Tensor]) -> None:
        sizes.append(int((args or (kwargs["input_ids"],))[0].shape[0]))

    return sizes, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("kwargs", [
    {"cache": "prefix"},
    {"cache": "prefix", "threshold": 0.3},
    {"cache": "prefix", "threshold": 0.05, "remasking": "low_confidence_dynamic", "temperature": 1.0, "top_k": 8},
    {"cache": None},
    {"cache": "prefix", "threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 2},
])
@pytest.mark.parametrize("fold", [True, False])
def test_finished_rows_retire_with_the_same_samples(
    tiny_block_model: torch.nn.Module, kwargs: dict[str, object], fold: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows that finished leave the batch (`speed.retire_rows`): later forwards run on fewer rows, and every
    row's tokens, mask, step log-probs and unmask steps are those of a batch that keeps them (float64)."""
    if "editing_threshold" in kwargs and tiny_block_model.traits.family != "llada2":  # type: ignore[union-attr]
        pytest.skip("editing is LLaDA2.1's decoding")
    model = tiny_block_model.double()
    prompts = [PROMPTS[i % 3] for i in range(10)]
    args: dict[str, object] = {"max_new_tokens": 24, "steps": 4, "block_length": 4, "seed": list(range(10)),
                               "temperature": 1.0, "record_trajectory": True, "eos_handling": "truncate", **kwargs}
    _stop_rows_apart(monkeypatch, model, prompts, args)
    out, rows = {}, {}
    for retire in (0, 1):
        seen, handle = _batch_sizes(model)
        speed = SpeedConfig(fold_store=fold, retire_rows=retire)
        out[retire] = generate(model, prompts, speed=speed, **args)  # type: ignore[arg-type]
        handle.remove()  # type: ignore[attr-defined]
        rows[retire] = seen
    keep, gone = out[0], out[1]
    assert set(rows[0]) == {10} and min(rows[1]) < 10 and rows[1] == sorted(rows[1], reverse=True)
    assert torch.equal(keep.response_ids, gone.response_ids)
    assert torch.equal(keep.response_mask, gone.response_mask)
    assert int((keep.response_mask.sum(1) < 24).sum()) >= 2  # rows did stop early
    assert keep.step_logp is not None and gone.step_logp is not None
    torch.testing.assert_close(keep.step_logp, gone.step_logp, rtol=0, atol=1e-10)
    assert keep.unmask_step is not None and gone.unmask_step is not None
    assert torch.equal(keep.unmask_step, gone.unmask_step)
    for key in keep.extras:
        assert torch.equal(keep.extras[key], gone.extras[key]), key


def test_rows_do_not_retire_with_per_step_records(tiny_block_model: torch.nn.Module,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`record_steps` keeps every row in the batch (its per-step records are per batch) and still stops
    finished rows: the same samples as without retirement."""
    model = tiny_block_model.double()
    prompts = [PROMPTS[i % 3] for i in range(10)]
    args: dict[str, object] = {"max_new_tokens": 24, "steps": 4, "block_length": 4, "seed": list(range(10)),
                               "temperature": 1.0, "cache": "prefix", "record_steps": True}
    _stop_rows_apart(monkeypatch, model, prompts, args)
    seen, handle = _batch_sizes(model)
    out = generate(model, prompts, speed=SpeedConfig(retire_rows=1), **args)  # type: ignore[arg-type]
    handle.remove()  # type: ignore[attr-defined]
    assert set(seen) == {10}
    ref = generate(model, prompts, speed=SpeedConfig(retire_rows=0), **args)  # type: ignore[arg-type]
    assert torch.equal(out.response_ids, ref.response_ids)


def test_every_stop_id_ends_a_row(tiny_block_model: torch.nn.Module) -> None:
    """A second stop id (SDAR chat's <|im_end|> beside <|endoftext|>) ends a row as the EOS does: the row
    decodes as without stops through the block holding its first stop id, is filled with EOS after that
    block, and its response mask counts the tokens through the first stop id."""
    import dataclasses

    traits = tiny_block_model.traits  # type: ignore[union-attr]
    eos = traits.eos_token_id
    args: dict[str, Any] = dict(max_new_tokens=24, steps=4, block_length=4, temperature=1.0, seed=1)
    free = generate(tiny_block_model, PROMPTS, stop_at_eos=False, **args)
    resp = free.response_ids

    def first(row: int, ids: set[int]) -> int:
        return next((i for i, t in enumerate(resp[row].tolist()) if t in ids), resp.shape[1])

    # the stop id: a token that ends some row before its EOS and before its last block
    other = min((t for t in resp.unique().tolist() if t != eos),
                key=lambda t: sum(first(r, {t}) for r in range(len(PROMPTS))))
    stops = {eos, other}
    assert any(first(r, {other}) < min(first(r, {eos}), resp.shape[1] - 4) for r in range(len(PROMPTS)))
    setattr(tiny_block_model, "traits", dataclasses.replace(traits, stop_token_ids=(other,)))
    stop = generate(tiny_block_model, PROMPTS, eos_handling="truncate", **args)
    offsets = [len(p) % 4 for p in PROMPTS]
    for row in range(len(PROMPTS)):
        end = first(row, stops)
        assert int(stop.response_mask[row].sum()) == min(end + 1, resp.shape[1])
        if end == resp.shape[1]:
            assert torch.equal(stop.response_ids[row], resp[row])
            continue
        block_end = ((offsets[row] + end) // 4 + 1) * 4 - offsets[row]
        assert torch.equal(stop.response_ids[row, :block_end], resp[row, :block_end])
        assert bool((stop.response_ids[row, block_end:] == eos).all())

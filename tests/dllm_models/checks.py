"""Property checks every family passes: save/load, padding, KV cache, block causality."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dllm_models import KVCache, load_model, save_model


def _ids(b: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 60, (b, n), generator=torch.Generator().manual_seed(seed))


def check_save_load_round_trip(model: nn.Module, tmp_path: Path) -> None:
    """Save then load gives bit-identical logits, single file and sharded."""
    ids = _ids(2, 9, 1)
    save_model(model, tmp_path / "ckpt")
    again = load_model(tmp_path / "ckpt")
    assert type(again) is type(model)
    assert set(again.state_dict()) == set(model.state_dict())
    torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    save_model(model, tmp_path / "sharded", max_shard_bytes=total // 3)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(load_model(tmp_path / "sharded")(ids).logits, model(ids).logits)


def check_left_padding(model: nn.Module) -> None:
    """Left padding never changes the logits of real positions (rows of different lengths)."""
    ids = _ids(2, 7, 2)
    pad = int(getattr(model, "traits").pad_token_id)
    padded = torch.cat([torch.full((2, 5), pad), ids], dim=1)
    mask = torch.ones_like(padded, dtype=torch.bool)
    mask[:, :5] = False
    out = model(padded, attention_mask=mask).logits[:, 5:]
    torch.testing.assert_close(out, model(ids).logits, rtol=1e-5, atol=1e-5)
    # row 0 shorter than row 1: both must equal their unpadded forwards
    mask[0, :7] = False
    out0 = model(padded, attention_mask=mask).logits[0, 7:]
    torch.testing.assert_close(out0, model(padded[:1, 7:]).logits[0], rtol=1e-5, atol=1e-5)


def check_kv_cache_bidirectional(model: nn.Module) -> None:
    """Queries attending to cached keys of the full pass equal the full forward there."""
    ids = _ids(2, 10, 3)
    pos = torch.arange(10)[None].expand(2, -1)
    full = model(ids, position_ids=pos).logits
    cache = model(ids, position_ids=pos, use_cache=True).past_key_values
    assert isinstance(cache, KVCache) and cache.length == 10
    tail = model(ids[:, 6:], position_ids=pos[:, 6:], past_key_values=cache.slice(0, 6)).logits
    torch.testing.assert_close(tail, full[:, 6:], rtol=1e-5, atol=1e-5)


def check_kv_cache_block_causal(model: nn.Module, block: int) -> None:
    """Cache of finished blocks + current block(s) == the full block-causal forward.

    The prefix forward sees only itself: under block-causal attention its keys equal the full
    pass's, so its cache is the one a block-diffusion decoder commits.
    """
    n = 4 * block
    ids = _ids(2, n, 4)
    pos = torch.arange(n)[None].expand(2, -1)
    full = model(ids).logits
    cache = model(ids[:, : 2 * block], use_cache=True).past_key_values
    assert isinstance(cache, KVCache) and cache.length == 2 * block
    one = model(ids[:, 2 * block : 3 * block], position_ids=pos[:, 2 * block : 3 * block], past_key_values=cache)
    torch.testing.assert_close(one.logits, full[:, 2 * block : 3 * block], rtol=1e-5, atol=1e-5)
    two = model(ids[:, 2 * block :], position_ids=pos[:, 2 * block :], past_key_values=cache)
    torch.testing.assert_close(two.logits, full[:, 2 * block :], rtol=1e-5, atol=1e-5)
    # left-padded rows whose paddings differ by a whole block: a cut after complete blocks of
    # both rows, padded prefix cache + the rest == the padded full forward
    pad = int(getattr(model, "traits").pad_token_id)
    padded = torch.cat([torch.full((2, block + 3), pad), ids], dim=1)
    am = torch.ones_like(padded, dtype=torch.bool)
    am[0, : block + 3] = False
    am[1, :3] = False
    full_p = model(padded, attention_mask=am).logits
    pos_p = (am.long().cumsum(-1) - 1).clamp(min=0)
    cut = block + 3 + 2 * block
    pre = model(padded[:, :cut], attention_mask=am[:, :cut], position_ids=pos_p[:, :cut], use_cache=True)
    assert pre.past_key_values is not None
    cur = model(
        padded[:, cut:], attention_mask=am[:, cut:], position_ids=pos_p[:, cut:],
        past_key_values=pre.past_key_values,
    ).logits
    torch.testing.assert_close(cur, full_p[:, cut:], rtol=1e-5, atol=1e-5)


def check_in_place_cache(model: nn.Module, block: int | None) -> None:
    """A canvas-wide cache written in place (`KVCache.write_columns`) == the full forward.

    Block-causal (`block` set): the finished blocks' keys sit in the cache, later columns hold
    garbage and are hidden by the key padding; the call for block 2 sees blocks 0-2 only and
    writes its own keys/values into its columns. Bidirectional (`block` None, Fast-dLLM's dual
    cache): every column is visible and the call refreshes its own.
    """
    b_len = block or 4
    n = 4 * b_len
    ids = _ids(2, n, 7) % 40  # every tiny vocab has 40 ordinary ids
    pos = torch.arange(n)[None].expand(2, -1)
    full = model(ids, position_ids=pos, use_cache=True)
    ref_kv = full.past_key_values
    assert isinstance(ref_kv, KVCache)
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(k.shape, generator=g) * 50 for k in ref_kv.keys]  # garbage where not written
    values = [torch.randn(v.shape, generator=g) * 50 for v in ref_kv.values]
    lo, hi = 2 * b_len, 3 * b_len
    visible = torch.zeros((2, n), dtype=torch.bool)
    if block is not None:
        for dst, src in zip(keys + values, ref_kv.keys + ref_kv.values):
            dst[:, :, :lo] = src[:, :, :lo]
        visible[:, :hi] = True
    else:
        for dst, src in zip(keys + values, ref_kv.keys + ref_kv.values):
            dst[:, :, hi:] = src[:, :, hi:]
            dst[:, :, :lo] = src[:, :, :lo]
        visible[:] = True
    cache = KVCache(keys, values, visible, write_columns=torch.arange(lo, hi))
    out = model(ids[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=cache).logits
    torch.testing.assert_close(out, full.logits[:, lo:hi], rtol=1e-5, atol=1e-5)
    for mine, ref in zip(cache.keys + cache.values, ref_kv.keys + ref_kv.values):
        torch.testing.assert_close(mine[:, :, lo:hi], ref[:, :, lo:hi], rtol=1e-5, atol=1e-5)
    bad = KVCache(keys, values, visible, write_columns=torch.arange(lo, hi + 1))
    try:
        model(ids[:, lo:hi], position_ids=pos[:, lo:hi], past_key_values=bad)
    except ValueError as err:
        assert "write_columns" in str(err)
    else:
        raise AssertionError("a write_columns/input length mismatch must raise")


def check_block_causality(model: nn.Module, block: int) -> None:
    """Changing a token in block 2 never changes logits of blocks 0-1, and does change block 2."""
    ids = _ids(1, 4 * block, 5)
    changed = ids.clone()
    changed[0, 2 * block + 1] = (ids[0, 2 * block + 1] + 1) % 60
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, : 2 * block], b[:, : 2 * block], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 2 * block : 3 * block], b[:, 2 * block : 3 * block])
    # within a block attention is bidirectional: the block's first position sees its last
    changed2 = ids.clone()
    changed2[0, 3 * block - 1] = (ids[0, 3 * block - 1] + 1) % 60
    assert not torch.allclose(a[:, 2 * block], model(changed2).logits[:, 2 * block])


def check_bidirectional(model: nn.Module) -> None:
    """Changing the last token changes the first position's logits."""
    ids = _ids(1, 8, 6)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 60
    assert not torch.allclose(model(ids).logits[:, 0], model(changed).logits[:, 0])

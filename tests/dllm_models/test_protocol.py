"""The forward protocol of every family: explicit `attention=` masks (packed rows, BD3LM layout),
`final_hidden` + `get_output_embeddings`, and the fused token log-prob on packed / BD3LM input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dllm_models.attention import AttentionMask, bd3lm_mask
from dllm_models.logprob import model_token_logprobs, output_head, shift_hidden
from dllm_models.packing import pack, pack_like, unpack
from tests.dllm_models.tiny_configs import build_tiny

FAMILIES = ["llada", "Dream", "sdar", "sdar_moe", "llada2_moe"]
BLOCK_FAMILIES = ["sdar", "sdar_moe", "llada2_moe"]
BLOCK = 4
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _build(family: str) -> nn.Module:
    return build_tiny(family)


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request: pytest.FixtureRequest) -> tuple[str, nn.Module]:
    return request.param, _build(request.param)


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """3 rows of 11: left padded (6 real), right padded (9 real), full; ids in [0, 40)."""
    ids = torch.randint(0, 40, (3, 11), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[0, :5] = False
    mask[1, 9:] = False
    return ids, mask


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
def test_packed_forward_equals_padded(family_model: tuple[str, nn.Module], backend: str) -> None:
    _, model = family_model
    ids, mask = _padded_batch()
    p = pack(ids, mask)
    attention = AttentionMask(cu_seqlens=p.cu_seqlens, max_seqlen=p.max_seqlen)
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        packed = model(p.input_ids, position_ids=p.position_ids, attention=attention, attention_backend=backend).logits
        # default positions of a packed row restart at every sequence
        default = model(p.input_ids, attention=attention, attention_backend=backend).logits
    assert model.attention_backend == "sdpa"  # a backend for one call leaves the model's own
    assert packed.shape == (1, p.num_tokens, padded.shape[-1])
    torch.testing.assert_close(unpack(packed, p)[mask], padded[mask], **TOL)
    torch.testing.assert_close(default, packed, rtol=0, atol=0)


def test_packed_sequences_never_see_each_other(family_model: tuple[str, nn.Module]) -> None:
    _, model = family_model
    ids, mask = _padded_batch()
    p = pack(ids, mask)
    attention = AttentionMask(cu_seqlens=p.cu_seqlens, max_seqlen=p.max_seqlen)
    changed = p.input_ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 40  # last token of the last sequence
    with torch.no_grad():
        a = model(p.input_ids, position_ids=p.position_ids, attention=attention).logits
        b = model(changed, position_ids=p.position_ids, attention=attention).logits
    first = int(p.cu_seqlens[2])
    # MoE layers group tokens by expert, so unrelated tokens may move results by rounding only
    torch.testing.assert_close(a[:, :first], b[:, :first], **TOL)
    assert (a[:, first:] - b[:, first:]).abs().max() > 1e-3


def test_final_hidden_and_head_give_forward(family_model: tuple[str, nn.Module]) -> None:
    _, model = family_model
    ids, mask = _padded_batch()
    p = pack(ids, mask)
    attention = AttentionMask(cu_seqlens=p.cu_seqlens, max_seqlen=p.max_seqlen)
    head = model.get_output_embeddings()  # type: ignore[operator]
    assert head is output_head(model) and isinstance(head, nn.Linear)
    with torch.no_grad():
        for args, kwargs in (
            ((ids,), {"attention_mask": mask}),
            ((p.input_ids,), {"position_ids": p.position_ids, "attention": attention}),
        ):
            hidden = model.final_hidden(*args, **kwargs)  # type: ignore[operator]
            logits = model(*args, **kwargs).logits
            assert hidden.shape == (*logits.shape[:2], head.in_features)
            torch.testing.assert_close(head(hidden).to(logits.dtype), logits, rtol=0, atol=0)


def _reference_shift(logits: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Dream's `cat(l[:, :1], l[:, :-1])` applied to every packed sequence on its own."""
    parts = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seg = logits[:, s:e]
        parts.append(torch.cat([seg[:, :1], seg[:, :-1]], dim=1))
    return torch.cat(parts, dim=1)


def _naive_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return torch.where(targets >= 0, ref, torch.zeros_like(ref))


def test_fused_logprobs_on_packed_batch(family_model: tuple[str, nn.Module]) -> None:
    _, model = family_model
    ids, mask = _padded_batch()
    p = pack(ids, mask)
    attention = AttentionMask(cu_seqlens=p.cu_seqlens, max_seqlen=p.max_seqlen)
    targets = pack_like(torch.randint(0, 40, ids.shape, generator=torch.Generator().manual_seed(8)), p)
    targets[0, :3] = -100
    kwargs = {"position_ids": p.position_ids, "attention": attention}
    with torch.no_grad():
        logits = model(p.input_ids, **kwargs).logits
        if model.traits.logit_shift:  # type: ignore[union-attr]
            logits = _reference_shift(logits, p.cu_seqlens)
        out = model_token_logprobs(model, p.input_ids, targets, chunk_size=7, **kwargs)
    torch.testing.assert_close(out, _naive_logprobs(logits, targets), **TOL)


def test_shift_restarts_at_every_packed_sequence() -> None:
    h = torch.arange(7.0)[None, :, None]
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    out = shift_hidden(h, AttentionMask(cu_seqlens=cu, max_seqlen=3))
    assert out[0, :, 0].tolist() == [0, 0, 1, 3, 4, 4, 5]
    assert shift_hidden(h)[0, :, 0].tolist() == [0, 0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------- BD3LM [x_t ; x_0] training layout

LENGTHS = [10, 7]


def _bd3lm_batch() -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Clean samples x_0, noised x_t (about half masked), packed ids and duplicated positions."""
    g = torch.Generator().manual_seed(11)
    x0 = [torch.randint(0, 40, (n,), generator=g) for n in LENGTHS]
    xt = [torch.where(torch.rand(n, generator=g) < 0.5, torch.full((n,), 63), x) for n, x in zip(LENGTHS, x0)]
    ids = torch.cat([torch.cat([a, b]) for a, b in zip(xt, x0)])[None]
    pos = torch.cat([torch.arange(n).repeat(2) for n in LENGTHS])[None]
    return x0, xt, ids, pos


def _segments() -> list[tuple[int, int]]:
    """(start of x_t, start of x_0) of every sample in the packed row."""
    out, s = [], 0
    for n in LENGTHS:
        out.append((s, s + n))
        s += 2 * n
    return out


@pytest.fixture(scope="module", params=BLOCK_FAMILIES)
def block_model(request: pytest.FixtureRequest) -> nn.Module:
    return build_tiny(request.param)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_bd3lm_forward_equals_concatenation_reference(block_model: nn.Module, backend: str) -> None:
    """Noisy block b == a plain block-causal forward of [x_0 blocks < b ; x_t block b] (its last
    block); the clean half == a plain forward of x_0."""
    x0, xt, ids, pos = _bd3lm_batch()
    mask = bd3lm_mask(LENGTHS, BLOCK)
    with torch.no_grad():
        out = block_model(ids, position_ids=pos, attention=mask, attention_backend=backend).logits
        default = block_model(ids, attention=mask, attention_backend=backend).logits  # positions restart per copy
    torch.testing.assert_close(default, out, rtol=0, atol=0)
    with torch.no_grad():
        for (t0, c0), n, a, c in zip(_segments(), LENGTHS, xt, x0):
            torch.testing.assert_close(out[0, c0:c0 + n], block_model(c[None]).logits[0], **TOL)
            for b in range(-(-n // BLOCK)):
                lo, hi = b * BLOCK, min((b + 1) * BLOCK, n)
                ref = block_model(torch.cat([c[:lo], a[lo:hi]])[None]).logits[0, lo:hi]
                torch.testing.assert_close(out[0, t0 + lo:t0 + hi], ref, **TOL)


def test_bd3lm_noisy_block_sees_only_its_block_and_earlier_clean_blocks(block_model: nn.Module) -> None:
    _, _, ids, pos = _bd3lm_batch()
    mask = bd3lm_mask(LENGTHS, BLOCK)
    t0, c0 = _segments()[0]
    b = 1  # noisy block 1 of sample 0: positions t0 + 4 .. t0 + 7
    q = slice(t0 + b * BLOCK, t0 + (b + 1) * BLOCK)
    with torch.no_grad():
        base = block_model(ids, position_ids=pos, attention=mask).logits[0, q]

        def changed(at: int) -> torch.Tensor:
            x = ids.clone()
            x[0, at] = (x[0, at] + 1) % 40
            return block_model(x, position_ids=pos, attention=mask).logits[0, q]

        unseen = [t0 + 0, t0 + 9, c0 + 4, c0 + 7, c0 + 9, 2 * LENGTHS[0] + 1]  # other noisy blocks,
        for at in unseen:  # clean blocks >= b, the other sample
            torch.testing.assert_close(changed(at), base, **TOL, msg=f"position {at} leaked")
        for at in (t0 + 4, t0 + 7, c0 + 0, c0 + 3):  # its own noisy block, clean block 0
            assert (changed(at) - base).abs().max() > 1e-3, f"position {at} not seen"


def test_bd3lm_fused_logprobs_and_final_hidden(block_model: nn.Module) -> None:
    x0, _, ids, pos = _bd3lm_batch()
    mask = bd3lm_mask(LENGTHS, BLOCK)
    targets = torch.full_like(ids, -100)
    for (t0, _), n, c in zip(_segments(), LENGTHS, x0):
        targets[0, t0:t0 + n] = c  # predict x_0 at the noisy copy only
    with torch.no_grad():
        logits = block_model(ids, position_ids=pos, attention=mask).logits
        hidden = block_model.final_hidden(ids, position_ids=pos, attention=mask)  # type: ignore[operator]
        out = model_token_logprobs(block_model, ids, targets, chunk_size=5, position_ids=pos, attention=mask)
    head = block_model.get_output_embeddings()  # type: ignore[operator]
    torch.testing.assert_close(head(hidden).to(logits.dtype), logits, rtol=0, atol=0)
    torch.testing.assert_close(out, _naive_logprobs(logits, targets), **TOL)


def test_packed_block_family_uses_per_sequence_grid() -> None:
    """Block ids of a packed row come from per-sequence positions: a sequence starting at offset 3
    in the pack still has its first block at its own positions 0-3."""
    model = build_tiny("sdar")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, 40, (3,), generator=g), torch.randint(0, 40, (9,), generator=g)
    cu = torch.tensor([0, 3, 12], dtype=torch.int32)
    with torch.no_grad():
        packed = model(torch.cat([a, b])[None], attention=AttentionMask(cu_seqlens=cu, max_seqlen=9)).logits
        alone = model(b[None]).logits
    torch.testing.assert_close(packed[0, 3:], alone[0], **TOL)


def test_explicit_attention_errors() -> None:
    model = build_tiny("sdar")
    ids = torch.randint(0, 40, (2, 6))
    with pytest.raises(ValueError, match="batch size 1"):
        model(ids, attention=AttentionMask(cu_seqlens=torch.tensor([0, 6], dtype=torch.int32)))
    with pytest.raises(ValueError, match="cover 5 positions"):
        model(ids[:1], attention=AttentionMask(cu_seqlens=torch.tensor([0, 5], dtype=torch.int32)))


def test_the_backend_the_kernels_and_the_logit_columns_are_forward_arguments(
        family_model: tuple[str, nn.Module], monkeypatch: pytest.MonkeyPatch) -> None:
    """`attention_backend=` picks the backend of one call (the model's own stays), every layer's
    attention call receives the model's `KernelConfig`, and `logit_columns=` gives the full forward's
    logits at those columns."""
    from dllm_models.attention import BACKENDS
    from dllm_models.layers import KernelConfig

    _, model = family_model
    seen: list[KernelConfig] = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
            kernels: KernelConfig = KernelConfig()) -> torch.Tensor:
        seen.append(kernels)
        return BACKENDS["sdpa"](q, k, v, mask, kernels)

    monkeypatch.setitem(BACKENDS, "spy", spy)
    monkeypatch.setattr(model, "kernels", KernelConfig(fused=False, decode_splits=3, decode_span=False))
    ids, mask = _padded_batch()
    cols = torch.tensor([7, 0, 10])
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        assert seen == []  # the model's own backend, sdpa
        picked = model(ids, attention_mask=mask, attention_backend="spy", logit_columns=cols).logits
    assert len(seen) == len([m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]) >= 2
    assert set(seen) == {model.kernels}
    assert model.attention_backend == "sdpa"
    torch.testing.assert_close(picked, full[:, cols], rtol=0, atol=0)

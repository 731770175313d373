"""pack/unpack round trip, per-sequence positions, packed attention equals padded attention."""

from __future__ import annotations

import pytest
import torch

from dllm_models.attention import AttentionMask, attend
from dllm_models.layers import positions_from_mask
from dllm_models.packing import pack, pack_like, unpack


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(1, 25).view(3, 8)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[0, :3] = False  # left padded, 5 real
    mask[1, 6:] = False  # right padded, 6 real
    return ids, mask


def test_pack_by_hand() -> None:
    ids, mask = _batch()
    p = pack(ids, mask)
    assert p.input_ids.tolist() == [[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 17, 18, 19, 20, 21, 22, 23, 24]]
    assert p.cu_seqlens.tolist() == [0, 5, 11, 19] and p.cu_seqlens.dtype == torch.int32
    assert p.max_seqlen == 8 and p.num_tokens == 19
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7]]


def test_round_trip_and_positions_match_padded() -> None:
    ids, mask = _batch()
    p = pack(ids, mask)
    back = unpack(p.input_ids, p, fill=-1)
    assert torch.equal(back, torch.where(mask, ids, -1))
    # positions restart per sequence exactly as the padded forward counts them
    pos = unpack(p.position_ids, p)
    assert torch.equal(pos[mask], positions_from_mask(mask)[mask])
    # trailing dims and gradients flow through unpack
    vals = torch.randn(p.num_tokens, 5, requires_grad=True)
    out = unpack(vals, p)
    assert out.shape == (3, 8, 5) and torch.equal(pack_like(out, p)[0], vals)
    out.sum().backward()
    assert vals.grad is not None and torch.equal(vals.grad, torch.ones_like(vals))


def test_packed_attention_equals_padded() -> None:
    ids, mask = _batch()
    p = pack(ids, mask)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 8, 16, generator=g) for _ in range(3))
    padded = attend(q, k, v, AttentionMask(key_padding=mask))

    def packed_rows(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, D] -> [1, H, T, D]
        return pack_like(x.transpose(1, 2), p)[0].transpose(0, 1)[None]

    out = attend(packed_rows(q), packed_rows(k), packed_rows(v), p.attention_mask(), backend="sdpa")
    torch.testing.assert_close(out, packed_rows(padded), rtol=1e-5, atol=1e-5)


def test_errors_name_the_shapes() -> None:
    ids, mask = _batch()
    with pytest.raises(ValueError, match="must equal input_ids shape"):
        pack(ids, mask[:, :4])
    p = pack(ids, mask)
    with pytest.raises(ValueError, match="the packing has 19"):
        unpack(torch.zeros(5), p)

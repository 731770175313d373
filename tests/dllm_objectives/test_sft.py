"""Tests for dllm_objectives.sft (docs/algorithms.md#sft)."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # row 0: response 4 tokens, masked {0, 1}, t = 0.5, logp -1, -2 -> weighted sum -6
    # row 1: response 2 tokens, masked {0}, t = 0.25, logp -1 -> weighted sum -4
    lp = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, -5.0, -9.0, -9.0]])
    mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    resp = torch.tensor([[True, True, True, True], [True, True, False, False]])
    return lp, mask, torch.tensor([0.5, 0.25]), resp


def test_sft_normalizers_hand_case() -> None:
    lp, mask, t, resp = _case()
    # response: mean(6 / 4, 4 / 2) = 1.75
    assert do.mdm_sft_loss(lp, mask, t, response_mask=resp).item() == pytest.approx(1.75)
    # masked: (6 + 4) / 3 masked tokens = 3.3333
    assert do.mdm_sft_loss(lp, mask, t, normalizer="masked").item() == pytest.approx(10 / 3)
    # answer_len: (6 + 4) / 6 response tokens = 1.6667
    out = do.mdm_sft_loss(lp, mask, t, normalizer="answer_len", response_mask=resp)
    assert out.item() == pytest.approx(10 / 6)
    # LLaDA2: no 1/t, masked normaliser: (1 + 2 + 1) / 3
    out = do.mdm_sft_loss(lp, mask, t, normalizer="masked", weight_by_t=False)
    assert out.item() == pytest.approx(4 / 3)


def test_sft_all_masked_t1_equals_mean_cross_entropy() -> None:
    lp = -torch.rand(3, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 5, dtype=torch.bool)
    out = do.mdm_sft_loss(lp, mask, torch.ones(3))
    assert out.item() == pytest.approx(-lp.mean().item(), abs=1e-6)


def test_sft_errors() -> None:
    lp, mask, t, _ = _case()
    with pytest.raises(ValueError, match="normalizer"):
        do.mdm_sft_loss(lp, mask, t, normalizer="tokens")
    with pytest.raises(ValueError, match="t must be > 0"):
        do.mdm_sft_loss(lp, mask, torch.zeros(2))
    with pytest.raises(ValueError, match="t must have shape"):
        do.mdm_sft_loss(lp, mask, torch.ones(3))

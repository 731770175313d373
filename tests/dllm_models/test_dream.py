"""Dream family: parity with transformers' Qwen2 made bidirectional, shift flag, properties."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dllm_models import build_model
from tests.dllm_models import checks
from tests.dllm_models.tiny_configs import EOS, MASK, build_tiny, tiny_dream_config


@pytest.fixture(scope="module")
def tiny_dream() -> torch.nn.Module:
    return build_tiny("Dream")


def _hf_qwen2(raw: dict[str, object]) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "rope_theta", "rms_norm_eps")
    cfg = Qwen2Config(**{k: raw[k] for k in keys}, tie_word_embeddings=False, attn_implementation="eager")
    return Qwen2ForCausalLM(cfg).eval()


def test_logits_match_transformers_qwen2_with_bidirectional_mask(tiny_dream: torch.nn.Module) -> None:
    hf = _hf_qwen2(tiny_dream_config())
    hf.load_state_dict(tiny_dream.state_dict(), strict=True)
    ids = torch.randint(0, 60, (2, 11), generator=torch.Generator().manual_seed(0))
    # a 4D additive mask of zeros is passed through as is: every query sees every key
    full = torch.zeros(2, 1, 11, 11)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=full).logits
        ours = tiny_dream(ids).logits
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # and with left padding: an additive mask hiding padded keys, padding-aware positions
    am = torch.ones(2, 11, dtype=torch.bool)
    am[0, :4] = False
    add = torch.zeros(2, 1, 11, 11).masked_fill(~am[:, None, None, :], torch.finfo(torch.float32).min)
    pos = (am.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=add, position_ids=pos).logits
        ours = tiny_dream(ids, attention_mask=am).logits
    torch.testing.assert_close(ours[am], ref[am], rtol=1e-5, atol=1e-5)


def test_traits_shift_flag_and_constants(tiny_dream: torch.nn.Module) -> None:
    t = getattr(tiny_dream, "traits")
    assert (t.family, t.logit_shift, t.block_length) == ("dream", 1, None)
    assert (t.mask_token_id, t.eos_token_id, t.pad_token_id) == (MASK, EOS, EOS)
    # without ids in config.json, the release's constants apply
    raw = tiny_dream_config()
    for k in ("mask_token_id", "eos_token_id", "pad_token_id"):
        raw.pop(k)
    d = getattr(build_model(raw), "traits")
    assert (d.mask_token_id, d.eos_token_id, d.pad_token_id) == (151666, 151643, 151643)


def test_bidirectional(tiny_dream: torch.nn.Module) -> None:
    checks.check_bidirectional(tiny_dream)


def test_save_load_round_trip(tmp_path: Path, tiny_dream: torch.nn.Module) -> None:
    checks.check_save_load_round_trip(tiny_dream, tmp_path)


def test_left_padding_does_not_change_real_positions(tiny_dream: torch.nn.Module) -> None:
    checks.check_left_padding(tiny_dream)


def test_kv_cache_equals_full_forward(tiny_dream: torch.nn.Module) -> None:
    checks.check_kv_cache_bidirectional(tiny_dream)


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        build_model(tiny_dream_config(hidden_size=66))


def test_in_place_cache_equals_full_forward(tiny_dream: torch.nn.Module) -> None:
    checks.check_in_place_cache(tiny_dream, None)

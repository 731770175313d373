"""SDAR dense and SDAR-MoE: parity with transformers' Qwen3 / Qwen3-MoE under a block-causal
mask, block causality, block-causal KV cache, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.dllm_models import checks
from tests.dllm_models.tiny_configs import build_tiny, tiny_sdar_config, tiny_sdar_moe_config

BLOCK = 4
_QWEN3_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "rope_theta", "rms_norm_eps")


@pytest.fixture(scope="module", params=["sdar", "sdar_moe"])
def tiny(request: pytest.FixtureRequest) -> torch.nn.Module:
    return build_tiny(request.param)


def _block_causal_additive(n: int, block: int, key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """[B or 1, 1, n, n] additive mask: 0 where block(key) <= block(query), min elsewhere."""
    blocks = torch.arange(n) // block
    allowed = (blocks[None, :] <= blocks[:, None])[None, None]
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def _compare(ours: torch.nn.Module, hf: torch.nn.Module) -> None:
    ids = torch.randint(0, 60, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=_block_causal_additive(11, BLOCK)).logits
        mine = ours(ids).logits
    torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


def test_sdar_logits_match_transformers_qwen3_block_causal() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    raw = tiny_sdar_config()
    ours = build_tiny("sdar")
    hf = Qwen3ForCausalLM(Qwen3Config(
        **{k: raw[k] for k in _QWEN3_KEYS}, tie_word_embeddings=False, attn_implementation="eager"
    )).eval()
    hf.load_state_dict(ours.state_dict(), strict=True)
    _compare(ours, hf)


def test_sdar_moe_logits_match_transformers_qwen3_moe_block_causal() -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    raw = tiny_sdar_moe_config()
    ours = build_tiny("sdar_moe")
    hf = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **{k: raw[k] for k in _QWEN3_KEYS},
        moe_intermediate_size=raw["moe_intermediate_size"], num_experts=raw["num_experts"],
        num_experts_per_tok=raw["num_experts_per_tok"], norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        attn_implementation="eager",
    )).eval()
    # transformers fuses the experts: gate_up_proj [E, 2I, H] = [gate; up], down_proj [E, H, I]
    state = {}
    sd = ours.state_dict()
    for name in hf.state_dict():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name.removesuffix("gate_up_proj")
            n_exp = int(raw["num_experts"])  # type: ignore[call-overload]
            state[name] = torch.stack([
                torch.cat([sd[f"{pre}{e}.gate_proj.weight"], sd[f"{pre}{e}.up_proj.weight"]])
                for e in range(n_exp)
            ])
        elif name.endswith("mlp.experts.down_proj"):
            pre = name.removesuffix("down_proj")
            state[name] = torch.stack([sd[f"{pre}{e}.down_proj.weight"] for e in range(int(raw["num_experts"]))])  # type: ignore[call-overload]
        else:
            state[name] = sd[name]
    hf.load_state_dict(state, strict=True)
    _compare(ours, hf)


def test_rmsnorm_scales_in_fp32() -> None:
    ours = build_tiny("sdar")
    layer = getattr(ours, "model").layers[0]
    assert layer.input_layernorm.scale_in_fp32 and layer.self_attn.q_norm.scale_in_fp32


def test_traits(tiny: torch.nn.Module) -> None:
    t = getattr(tiny, "traits")
    assert (t.block_length, t.logit_shift, t.mask_token_id) == (BLOCK, 0, 63)


def test_sdar_moe_defaults_without_mask_id_or_block_size() -> None:
    from dllm_models import build_model

    raw = tiny_sdar_moe_config()
    for k in ("mask_token_id", "block_size", "pad_token_id"):
        raw.pop(k)
    t = getattr(build_model(raw), "traits")
    assert (t.mask_token_id, t.block_length, t.pad_token_id) == (151669, 4, 151643)


def test_block_causality(tiny: torch.nn.Module) -> None:
    checks.check_block_causality(tiny, BLOCK)


def test_kv_cache_of_finished_blocks_equals_full_forward(tiny: torch.nn.Module) -> None:
    checks.check_kv_cache_block_causal(tiny, BLOCK)


def test_left_padding_does_not_change_real_positions(tiny: torch.nn.Module) -> None:
    checks.check_left_padding(tiny)


def test_save_load_round_trip(tmp_path: Path, tiny: torch.nn.Module) -> None:
    checks.check_save_load_round_trip(tiny, tmp_path)


def test_in_place_cache_equals_full_forward(tiny: torch.nn.Module) -> None:
    checks.check_in_place_cache(tiny, BLOCK)

"""LLaDA2.x family: router arithmetic, MoE parity with transformers' DeepSeek-V3 MoE block,
partial RoPE, block causality, block-causal KV cache, round trips, fp32 logits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dllm_models.families.moe import GroupLimitedSigmoidRouter
from dllm_models.layers import apply_rope, rope_cos_sin
from tests.dllm_models import checks
from tests.dllm_models.tiny_configs import build_tiny, tiny_llada2_config

BLOCK = 4


@pytest.fixture(scope="module")
def tiny_llada2() -> torch.nn.Module:
    model = build_tiny("llada2_moe")
    bias = getattr(model, "model").layers[1].mlp.gate.expert_bias
    bias.copy_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(9)) * 0.1)
    return model


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_group_limited_router_hand_worked() -> None:
    # 8 experts in 4 groups of 2, keep 2 groups, top-2 experts. The gate is the identity, so the
    # sigmoid scores are exactly the probabilities we feed as logits.
    router = GroupLimitedSigmoidRouter(8, 8, 2, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    router.weight.data = torch.eye(8)
    s = [0.95, 0.05, 0.62, 0.60, 0.55, 0.55, 0.10, 0.10]
    x = torch.tensor([[_logit(p) for p in s]])
    # group scores (sum of the top-2): g0 1.00, g1 1.22, g2 1.10, g3 0.20 -> keep g1, g2; expert 0
    # (0.95, the best single score) is excluded with its group. Top-2 in g1+g2: e2 0.62, e3 0.60.
    ids, w = router(x)
    assert sorted(ids[0].tolist()) == [2, 3]
    # weights: unbiased scores normalised to 1, times 2.5: 0.62/1.22*2.5, 0.60/1.22*2.5
    expect = {2: 0.62 / 1.22 * 2.5, 3: 0.60 / 1.22 * 2.5}
    for e, wt in zip(ids[0].tolist(), w[0].tolist()):
        assert wt == pytest.approx(expect[e], rel=1e-5)
    # a bias of +0.2 on e4 lifts g2 to 1.30 and e4 to 0.75 for *selection*: picks e4 and e2,
    # but the combine weights use the unbiased 0.55 and 0.62: 0.55/1.17*2.5, 0.62/1.17*2.5
    router.expert_bias[4] = 0.2
    ids, w = router(x)
    got = dict(zip(ids[0].tolist(), w[0].tolist()))
    assert set(got) == {2, 4}
    assert got[4] == pytest.approx(0.55 / 1.17 * 2.5, rel=1e-5)
    assert got[2] == pytest.approx(0.62 / 1.17 * 2.5, rel=1e-5)


def test_moe_layer_matches_transformers_deepseek_v3_moe(tiny_llada2: torch.nn.Module) -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    raw = tiny_llada2_config()
    ours = getattr(tiny_llada2, "model").layers[1].mlp
    hf = DeepseekV3MoE(DeepseekV3Config(
        hidden_size=raw["hidden_size"], moe_intermediate_size=raw["moe_intermediate_size"],
        n_routed_experts=raw["num_experts"], num_experts_per_tok=raw["num_experts_per_tok"],
        n_group=raw["n_group"], topk_group=raw["topk_group"], n_shared_experts=1,
        routed_scaling_factor=raw["routed_scaling_factor"], norm_topk_prob=True,
    )).eval()
    e = range(int(raw["num_experts"]))  # type: ignore[call-overload]
    state = {
        "gate.weight": ours.gate.weight,
        "gate.e_score_correction_bias": ours.gate.expert_bias,
        "experts.gate_up_proj": torch.stack([
            torch.cat([ours.experts[i].gate_proj.weight, ours.experts[i].up_proj.weight]) for i in e
        ]),
        "experts.down_proj": torch.stack([ours.experts[i].down_proj.weight for i in e]),
        **{f"shared_experts.{k}": v for k, v in ours.shared_experts.state_dict().items()},
    }
    hf.load_state_dict(state, strict=True)
    x = torch.randn(2, 7, int(raw["hidden_size"]), generator=torch.Generator().manual_seed(1))  # type: ignore[call-overload]
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-5)


def test_partial_rope_rotates_first_dims_only() -> None:
    # LLaDA2: rotary_dim 64 of 128, inv_freq[i] = theta^(-2i/64), dim i pairs with i + 32
    pos = torch.arange(5)[None]
    cos, sin = rope_cos_sin(pos, 8, 600000.0)
    inv = torch.tensor([600000.0 ** (-2 * i / 8) for i in range(4)])
    torch.testing.assert_close(cos[0, 0, :, :4], torch.cos(pos[0, :, None].float() * inv))
    x = torch.randn(1, 2, 5, 16)
    y = apply_rope(x, cos, sin, full_precision=False)
    assert torch.equal(y[..., 8:], x[..., 8:])
    expect0 = x[..., 0] * cos[..., 0] - x[..., 4] * sin[..., 0]
    torch.testing.assert_close(y[..., 0], expect0)


def test_layout_dense_first_then_moe_and_fp32_logits(tiny_llada2: torch.nn.Module) -> None:
    layers = getattr(tiny_llada2, "model").layers
    assert not hasattr(layers[0].mlp, "experts") and len(layers[1].mlp.experts) == 8
    names = set(tiny_llada2.state_dict())
    assert "model.layers.1.mlp.gate.expert_bias" in names
    assert "model.layers.0.attention.query_key_value.weight" in names
    bf = build_tiny("llada2_moe").to(torch.bfloat16)
    assert bf(torch.randint(0, 60, (1, 5))).logits.dtype == torch.float32


def test_traits(tiny_llada2: torch.nn.Module) -> None:
    t = getattr(tiny_llada2, "traits")
    assert (t.family, t.block_length, t.logit_shift, t.mask_token_id) == ("llada2", BLOCK, 0, 63)
    from dllm_models import build_model

    raw = tiny_llada2_config()
    for k in ("mask_token_id", "block_length", "eos_token_id"):
        raw.pop(k)
    d = getattr(build_model(raw), "traits")
    assert (d.mask_token_id, d.block_length, d.eos_token_id) == (156895, 32, 156892)


def test_block_causality(tiny_llada2: torch.nn.Module) -> None:
    checks.check_block_causality(tiny_llada2, BLOCK)


def test_kv_cache_of_finished_blocks_equals_full_forward(tiny_llada2: torch.nn.Module) -> None:
    checks.check_kv_cache_block_causal(tiny_llada2, BLOCK)


def test_left_padding_does_not_change_real_positions(tiny_llada2: torch.nn.Module) -> None:
    checks.check_left_padding(tiny_llada2)


def test_save_load_round_trip(tmp_path: Path, tiny_llada2: torch.nn.Module) -> None:
    checks.check_save_load_round_trip(tiny_llada2, tmp_path)


def _glm4_moe_state(ours: torch.nn.Module, raw: dict[str, object]) -> dict[str, torch.Tensor]:
    """Our LLaDA2 weights under transformers' GLM-4-MoE names (split QKV, fused experts)."""
    sd = ours.state_dict()
    h, kv, hd = int(raw["num_attention_heads"]), int(raw["num_key_value_heads"]), int(raw["head_dim"])  # type: ignore[call-overload]
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": sd["model.word_embeddings.weight"],
        "model.norm.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(int(raw["num_hidden_layers"])):  # type: ignore[call-overload]
        p, q = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        qw, kw, vw = sd[p + "attention.query_key_value.weight"].split([h * hd, kv * hd, kv * hd])
        out.update({q + "q_proj.weight": qw, q + "k_proj.weight": kw, q + "v_proj.weight": vw})
        out[q + "o_proj.weight"] = sd[p + "attention.dense.weight"]
        out[q + "q_norm.weight"] = sd[p + "attention.query_layernorm.weight"]
        out[q + "k_norm.weight"] = sd[p + "attention.key_layernorm.weight"]
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = sd[p + n]
        if i < int(raw["first_k_dense_replace"]):  # type: ignore[call-overload]
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}mlp.{n}.weight"] = sd[f"{p}mlp.{n}.weight"]
            continue
        e = range(int(raw["num_experts"]))  # type: ignore[call-overload]
        out[p + "mlp.gate.weight"] = sd[p + "mlp.gate.weight"]
        out[p + "mlp.gate.e_score_correction_bias"] = sd[p + "mlp.gate.expert_bias"]
        out[p + "mlp.experts.gate_up_proj"] = torch.stack([
            torch.cat([sd[f"{p}mlp.experts.{j}.gate_proj.weight"], sd[f"{p}mlp.experts.{j}.up_proj.weight"]])
            for j in e
        ])
        out[p + "mlp.experts.down_proj"] = torch.stack([sd[f"{p}mlp.experts.{j}.down_proj.weight"] for j in e])
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}mlp.shared_experts.{n}.weight"] = sd[f"{p}mlp.shared_experts.{n}.weight"]
    return out


def test_logits_match_transformers_glm4_moe_block_causal(tiny_llada2: torch.nn.Module) -> None:
    # GLM-4-MoE shares Ling-2.0's math: q/k norm before partial RoPE, dense first layer, biased
    # group-limited sigmoid router, shared expert. Only the names differ (split QKV).
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    raw = tiny_llada2_config()
    hf = Glm4MoeForCausalLM(Glm4MoeConfig(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"], moe_intermediate_size=raw["moe_intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw["num_key_value_heads"], head_dim=raw["head_dim"],
        partial_rotary_factor=raw["partial_rotary_factor"], rope_theta=raw["rope_theta"],
        n_routed_experts=raw["num_experts"], n_shared_experts=1,
        num_experts_per_tok=raw["num_experts_per_tok"], n_group=raw["n_group"],
        topk_group=raw["topk_group"], first_k_dense_replace=raw["first_k_dense_replace"],
        norm_topk_prob=True, routed_scaling_factor=raw["routed_scaling_factor"],
        rms_norm_eps=raw["rms_norm_eps"], use_qk_norm=True, attention_bias=False,
        tie_word_embeddings=False, attn_implementation="eager",
    )).eval()
    hf.load_state_dict(_glm4_moe_state(tiny_llada2, raw), strict=True)
    n = 11
    blocks = torch.arange(n) // BLOCK
    allowed = (blocks[None, :] <= blocks[:, None])[None, None]
    add = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    ids = torch.randint(0, 60, (2, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=add).logits
        ours = tiny_llada2(ids).logits
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_in_place_cache_equals_full_forward(tiny_llada2: torch.nn.Module) -> None:
    checks.check_in_place_cache(tiny_llada2, BLOCK)


def test_rotary_dims_follow_the_release_code() -> None:
    from dllm_models.families.llada2 import LLaDA2Config

    raw = tiny_llada2_config()
    raw.pop("rotary_dim")
    raw.pop("partial_rotary_factor")
    assert LLaDA2Config.from_hf(raw).rope_dim == 8  # release default factor 0.5 of head_dim 16
    assert LLaDA2Config.from_hf(tiny_llada2_config(rotary_dim=None, partial_rotary_factor=0.25)).rope_dim == 4
    with pytest.raises(ValueError, match="rotary_dim=12 disagrees with head_dim"):
        LLaDA2Config.from_hf(tiny_llada2_config(rotary_dim=12))

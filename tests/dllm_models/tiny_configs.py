"""Tiny config.json dicts of each family (2 layers, small width and vocab, few experts).

Special ids sit at the top of the vocab: mask 63, eos/pad 62; real tokens are drawn from [0, 60).
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 64
MASK = 63
EOS = 62


def tiny_dream_config(**overrides: object) -> dict[str, object]:
    """Dream (Qwen2 layout): width 64, 4 heads of 16, 2 KV heads, q/k/v biases."""
    cfg: dict[str, object] = {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": VOCAB,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def tiny_sdar_config(**overrides: object) -> dict[str, object]:
    """Dense SDAR (Qwen3 layout): head_dim 16 with q width 64 > hidden 48, block 4."""
    cfg: dict[str, object] = {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "vocab_size": VOCAB,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "block_size": 4,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def tiny_sdar_moe_config(**overrides: object) -> dict[str, object]:
    """SDAR-MoE (Qwen3-MoE layout): 8 experts, top-2, every layer sparse, block 4."""
    cfg = tiny_sdar_config(
        model_type="sdar_moe",
        architectures=["SDARMoeForCausalLM"],
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    cfg.update(overrides)
    return cfg


def tiny_llada2_config(**overrides: object) -> dict[str, object]:
    """LLaDA2 (Ling-2.0 layout): layer 0 dense, layer 1 MoE with 8 experts in 4 groups
    (keep 2, top-2), one shared expert, partial RoPE on 8 of 16 dims, block 4."""
    cfg: dict[str, object] = {
        "model_type": "llada2_moe",
        "architectures": ["LLaDA2MoeModelLM"],
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "partial_rotary_factor": 0.5,
        "rotary_dim": 8,
        "vocab_size": VOCAB,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "block_length": 4,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


TINY_CONFIGS = {
    "Dream": tiny_dream_config,
    "sdar": tiny_sdar_config,
    "sdar_moe": tiny_sdar_moe_config,
    "llada2_moe": tiny_llada2_config,
}


def build_tiny(family: str, seed: int = 0, std: float = 0.2, **overrides: object) -> nn.Module:
    """A tiny model of `family` (a TINY_CONFIGS key, or "llada": conftest's tiny LLaDA) with seeded
    normal(0, std) weights, in eval mode."""
    from dllm_models import build_model

    if family == "llada":
        from tests.conftest import tiny_llada_config

        raw = tiny_llada_config(**overrides)
    else:
        raw = TINY_CONFIGS[family](**overrides)
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(seed), std=std)  # type: ignore[operator]
    return model.eval()

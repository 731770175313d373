"""Shared fixtures: tiny models of each family built in process."""

from __future__ import annotations

import pytest
import torch


def tiny_llada_config(**overrides: object) -> dict[str, object]:
    """config.json dict of a tiny LLaDA-architecture model (2 layers, width 64, vocab 50)."""
    cfg: dict[str, object] = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 4,
        "mlp_hidden_size": 128,
        "vocab_size": 50,
        "embedding_size": 50,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_sequence_length": 256,
        "mask_token_id": 49,
        "eos_token_id": 48,
        "pad_token_id": 48,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


@pytest.fixture
def tiny_llada() -> torch.nn.Module:
    from dllm_models import build_model

    model = build_model(tiny_llada_config())
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.2)  # type: ignore[operator]
    return model.eval()

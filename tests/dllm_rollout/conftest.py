"""Tiny models of every family for rollout tests (fall back to a tiny LLaDA when absent)."""

from __future__ import annotations

import pytest
import torch


def tiny(family: str, **overrides: object) -> torch.nn.Module:
    """A seeded tiny model of `family`, skipping the test if the family is not available."""
    try:
        from tests.dllm_models.tiny_configs import build_tiny
    except ImportError:
        pytest.skip(f"tests/dllm_models/tiny_configs.py is missing; cannot build a tiny {family}")
    return build_tiny(family, **overrides)


@pytest.fixture(params=["sdar", "llada2_moe"])
def tiny_block_model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return tiny(str(request.param))


@pytest.fixture
def tiny_dream() -> torch.nn.Module:
    return tiny("Dream")

"""Shared fixtures: tiny models of each family built in process, and one Ray cluster per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RAY_TEST_TIMEOUT_S = 240
"""Per-test bound of `ray` tests (14-33 s each on a shared 2-core machine, mostly actor start-up),
well under the suite's global 600 s: a hung rank fails its test, not the whole suite."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every `ray` test the `RAY_TEST_TIMEOUT_S` bound unless it sets its own timeout."""
    for item in items:
        if item.get_closest_marker("ray") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster for the session (each init/shutdown cycle costs 6-9 s on 2 cores)."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # actors unpickle test helpers (`tests.dllm_train...`): put the repo root on their path
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


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
    from tests.dllm_models.tiny_configs import build_tiny

    return build_tiny("llada")

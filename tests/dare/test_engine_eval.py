"""`dare eval --engine lmdeploy`: the runner's generate function served by the engine (fake lmdeploy 0.18)."""

from __future__ import annotations

import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dllm_rollout import SamplingConfig

from dare.engine_eval import EngineGenerate, engine_generate
from tests.dllm_rollout.test_lmdeploy import EOS, GenerationConfig, FakePipeline, PytorchEngineConfig, _folder


@pytest.fixture()
def fake_lmdeploy(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("lmdeploy")
    mod.GenerationConfig = GenerationConfig  # type: ignore[attr-defined]
    mod.PytorchEngineConfig = PytorchEngineConfig  # type: ignore[attr-defined]
    mod.pipeline = FakePipeline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lmdeploy", mod)


def _model(block: int | None) -> Any:
    return types.SimpleNamespace(traits=types.SimpleNamespace(block_length=block, family="sdar", eos_token_id=EOS,
                                                              pad_token_id=0))


def test_the_runner_config_decodes_through_one_engine(fake_lmdeploy: None, tmp_path: Path) -> None:
    gen = EngineGenerate(_folder(tmp_path), stop_ids=(EOS,), pad_id=0)
    cfg = SamplingConfig(max_new_tokens=5, steps=4, block_length=4, temperature=0.0, remasking="low_confidence",
                         cache="prefix", threshold=None, block_diffusion=True)
    out = gen(_model(4), [[1, 2]], cfg, seed=[3])
    first = gen.engine
    assert out.response_ids.tolist() == [[3, 4, 5, EOS, 0]]
    gen(_model(4), [[1]], replace(cfg, max_new_tokens=8), seed=[4])   # same engine settings: same engine
    assert gen.engine is first
    gen(_model(4), [[1]], replace(cfg, steps=2), seed=[5])             # other unmasking: a new engine
    assert gen.engine is not first and first.pipe.closed
    gen.close()


def test_native_needs_no_engine_and_masked_models_are_refused(tmp_path: Path) -> None:
    assert engine_generate("native", str(tmp_path), _model(None)) is None
    with pytest.raises(ValueError, match="--engine native"):
        engine_generate("lmdeploy", str(tmp_path), _model(None))

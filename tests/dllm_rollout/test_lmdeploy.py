"""`LMDeployEngine` against a fake of lmdeploy 0.18.0's API (no lmdeploy needed).

The fake follows what lmdeploy 0.18.0 does (read in its source, and seen on an H200,
benchmarks/engine_decode.py): `pipeline(...)` builds an `AsyncEngine` whose loop runs in
`internal_thread.loop`; `pipe(...)` rejects lists of token ids; `AsyncEngine.preprocess(messages=None,
input_ids=...)` then `generate(request, stream_response=False)` take them; the stop token is stripped
from `token_ids` unless `include_stop_str_in_output=True`; `Engine.update_params` raises
`NotImplementedError` on one GPU; `sleep`/`wakeup` move the weights off and back.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_rollout import SamplingConfig
from dllm_rollout.engines.lmdeploy import (
    LMDeployEngine,
    compare_served,
    hf_overrides,
    lmdeploy_engine_config,
    lmdeploy_gen_config,
)

EOS = 9
CFG = SamplingConfig(max_new_tokens=5, steps=4, block_length=4, temperature=0.0, block_diffusion=True)


@dataclass
class GenerationConfig:
    max_new_tokens: int = 512
    do_sample: bool = False
    top_p: float = 1.0
    top_k: int = 50
    temperature: float = 0.8
    ignore_eos: bool = False
    random_seed: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False


@dataclass
class PytorchEngineConfig:
    dllm_block_length: int | None = None
    dllm_denoising_steps: int | None = None
    dllm_unmasking_strategy: str | None = None
    dllm_confidence_threshold: float = 0.85
    max_batch_size: int | None = None
    cache_max_entry_count: float = 0.8
    hf_overrides: dict[str, Any] | None = None


@dataclass
class GenOut:
    response: str
    input_token_len: int
    generate_token_len: int
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class FakeModel(torch.nn.Module):
    """lmdeploy's SDAR layout: fused qkv_proj and gate_up_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(6, 2))
        self.o = torch.nn.Parameter(torch.zeros(2, 2))

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]:  # type: ignore[override]
        yield "model.layers.0.self_attn.qkv_proj.weight", self.qkv
        yield "model.layers.0.self_attn.o_proj.weight", self.o


class FakeAgent:
    def __init__(self) -> None:
        self.model = FakeModel()
        self.patched_model = types.SimpleNamespace(get_model=lambda: self.model)
        self.loaded: list[str] = []
        self.finalized = 0

    @contextlib.contextmanager
    def all_context(self) -> Iterator[None]:
        yield

    def _load_updated_weight_bucket(self, weights: list[tuple[str, torch.Tensor]], op_name: str) -> None:
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in weights:
                if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                    i = ("q_proj", "k_proj", "v_proj").index(name.split(".")[-2])
                    own["model.layers.0.self_attn.qkv_proj.weight"][2 * i:2 * i + 2].copy_(t)
                else:
                    own[name].copy_(t)
                self.loaded.append(name)

    def _finalize_updated_weights(self) -> None:
        self.finalized += 1


class FakeEngine:
    def __init__(self) -> None:
        self.executor = types.SimpleNamespace(model_agent=FakeAgent())

    def update_params(self, request: Any) -> None:
        raise NotImplementedError("Not Implemented.")


class FakeAsyncEngine:
    def __init__(self, backend: PytorchEngineConfig) -> None:
        self.backend_config = backend
        self.engine = FakeEngine()
        self.asleep: set[str] = set()
        self.seen: list[GenerationConfig] = []

    async def preprocess(self, messages: Any, session_id: Any, gen_config: GenerationConfig | None = None,
                         input_ids: list[int] | None = None, **kwargs: Any) -> Any:
        if (messages is not None) ^ (input_ids is None):
            raise ValueError("You must specify exactly one of messages or input_ids.")
        return types.SimpleNamespace(ids=list(input_ids or []), gen=gen_config)

    async def generate(self, request: Any, stream_response: bool = True) -> Any:
        assert not self.asleep, "generate while asleep"
        gen = request.gen
        self.seen.append(gen)
        # a deterministic 'model': echo the prompt's last id + 1.., stopping at EOS after 3 tokens
        # as 0.18.0's AsyncEngine.generate: the new tokens in chunks (stop token held back), then a
        # last chunk holding the stop token only with include_stop_str_in_output
        out = [request.ids[-1] + 1 + i for i in range(3)]
        n = len(request.ids)
        yield GenOut(response="", input_token_len=n, generate_token_len=2, token_ids=out[:2])
        yield GenOut(response="", input_token_len=n, generate_token_len=3, token_ids=out[2:])
        yield GenOut(response="", input_token_len=n, generate_token_len=3, finish_reason="stop",
                     token_ids=[EOS] if gen.include_stop_str_in_output else [])

    async def sleep(self, level: int = 1) -> None:
        self.asleep = {"weights", "kv_cache"}

    def wakeup(self, tags: list[str] | None = None) -> None:
        self.asleep -= set(tags or ["weights", "kv_cache"])


class FakePipeline:
    def __init__(self, model_path: str, backend_config: PytorchEngineConfig) -> None:
        self.model_path = model_path
        self.async_engine = FakeAsyncEngine(backend_config)
        self.session_mgr = types.SimpleNamespace(get=lambda: object())
        loop = asyncio.new_event_loop()
        self.internal_thread = types.SimpleNamespace(loop=loop)
        self._thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._thread.start()
        self.closed = False

    def __call__(self, prompts: Any, gen_config: Any = None) -> Any:
        if isinstance(prompts, list) and prompts and isinstance(prompts[0], list):
            raise TypeError("prompts must be text or messages")
        raise AssertionError("the adapter must not call pipe(...)")

    def close(self) -> None:
        self.internal_thread.loop.call_soon_threadsafe(self.internal_thread.loop.stop)
        self.closed = True


@pytest.fixture()
def fake_lmdeploy(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType("lmdeploy")
    mod.GenerationConfig = GenerationConfig  # type: ignore[attr-defined]
    mod.PytorchEngineConfig = PytorchEngineConfig  # type: ignore[attr-defined]
    mod.pipeline = FakePipeline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lmdeploy", mod)
    return mod


def _folder(tmp_path: Path, *, remote_code: bool = False) -> Path:
    (tmp_path / "config.json").write_text('{"rope_theta": 1000000.0}')
    (tmp_path / "generation_config.json").write_text('{"pad_token_id": 7, "eos_token_id": 9}')
    if remote_code:
        (tmp_path / "configuration_sdar.py").write_text("")
    return tmp_path


def test_generate_from_token_ids_keeps_the_stop_token(fake_lmdeploy: Any, tmp_path: Path) -> None:
    engine = LMDeployEngine(_folder(tmp_path), CFG, stop_ids=(EOS,), pad_id=0)
    batch = engine.generate([[1, 2, 3], [4]], seed=0)
    assert batch.response_ids.tolist() == [[4, 5, 6, EOS, 0], [5, 6, 7, EOS, 0]]
    assert batch.response_mask.tolist() == [[True] * 4 + [False], [True] * 4 + [False]]
    seen = engine.pipe.async_engine.seen
    assert all(g.random_seed is None and g.include_stop_str_in_output and not g.do_sample for g in seen)
    backend = engine.pipe.async_engine.backend_config
    assert backend.dllm_unmasking_strategy == "low_confidence_static" and backend.dllm_denoising_steps == 4
    assert backend.hf_overrides == {"pad_token_id": 7, "rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 1000000.0}}
    assert LMDeployEngine.replayable is False


def test_hf_overrides_only_without_remote_code(tmp_path: Path) -> None:
    assert hf_overrides(_folder(tmp_path, remote_code=True)) == {}


def test_sleep_wake_hands_over_weights_and_checks_them(fake_lmdeploy: Any, tmp_path: Path) -> None:
    engine = LMDeployEngine(_folder(tmp_path), CFG, stop_ids=(EOS,), pad_id=0)
    policy = {f"model.layers.0.self_attn.{p}_proj.weight": torch.full((2, 2), float(i))
              for i, p in enumerate("qkvo")}
    assert not engine.check_weights(policy).ok
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([[1]])
    engine.wake(policy.items())
    agent = engine.pipe.async_engine.engine.executor.model_agent
    assert agent.finalized == 1 and not engine.pipe.async_engine.asleep
    check = engine.check_weights(policy)
    assert check.ok and check.compared == 2 == check.total
    stale = dict(policy, **{"model.layers.0.self_attn.k_proj.weight": torch.zeros(2, 2)})
    assert engine.check_weights(stale).mismatched == ("model.layers.0.self_attn.qkv_proj.weight",)
    engine.close()
    assert engine.pipe.closed


def test_compare_served_counts_unknown_tensors_as_mismatches() -> None:
    served = {"a.weight": torch.ones(2), "extra.weight": torch.ones(1)}
    check = compare_served(served, {"a.weight": torch.ones(2)})
    assert not check.ok and check.mismatched == ("extra.weight",) and check.compared == 1


def test_refusals_name_the_field() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        lmdeploy_engine_config(SamplingConfig(max_new_tokens=8, steps=3, block_length=4, block_diffusion=True))
    with pytest.raises(ValueError, match="rollout.steps=4"):
        lmdeploy_engine_config(SamplingConfig(max_new_tokens=8, steps=2, block_length=4, threshold=0.9,
                                              remasking="low_confidence_dynamic", block_diffusion=True))
    # a threshold on the quota rule (filtered confidence, >=) is not lmdeploy's dynamic strategy
    with pytest.raises(ValueError, match="rollout.remasking=low_confidence_dynamic"):
        lmdeploy_engine_config(SamplingConfig(max_new_tokens=8, steps=4, block_length=4, threshold=0.9,
                                              block_diffusion=True))
    with pytest.raises(ValueError, match="traits.stop_ids"):
        lmdeploy_gen_config(CFG, stop_ids=(-1,))
    with pytest.raises(ValueError, match="traits.stop_ids"):
        lmdeploy_gen_config(CFG, stop_ids=())


def test_missing_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "lmdeploy", None)
    with pytest.raises(ImportError, match="dllm-rollout\\[lmdeploy\\]"):
        LMDeployEngine(_folder(tmp_path), CFG, stop_ids=(EOS,), pad_id=0)

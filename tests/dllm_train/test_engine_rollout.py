"""`rollout.engine`: the engine rollout worker's hand-off, checks and refusals, against a fake engine.

The fake engine holds its own copy of the model and decodes with the native decoder, so an RL run
whose rollouts come from it must equal a native run step for step, which holds only if every
step's hand-off gave the engine the actor's updated weights.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_algorithms import BGPO, D1, MDPO
from dllm_models import apply_lora
from dllm_rollout import SamplingConfig, generate
from dllm_rollout.engines.lmdeploy import compare_served
from dllm_train import engine_rollout
from dllm_train.engine_rollout import EngineRolloutWorker, check_engine_support, release_weights
from dllm_train import LocalRL, OptimConfig, TrainerConfig
from tests.tiny_rl import TOK, addition_prompts, fast, local_rl, partial_reward, reproducible, tiny_model  # noqa: F401

SAMPLING = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0)


class FakeEngine:
    """Its own model copy; decodes with `generate`; records what it was asked to do."""

    def __init__(self, model: Any, cfg: SamplingConfig, *, stale: bool = False, off_by_one: bool = False) -> None:
        self.model = copy.deepcopy(model)
        self.cfg = cfg
        self.calls: list[str] = []
        self.stale = stale
        self.off_by_one = off_by_one  # serves the right weights but decodes something else

    def load_weights(self, named: Any) -> None:
        self.calls.append("load")
        if self.stale and self.calls.count("load") + self.calls.count("wake") > 1:
            return
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named:
                own[name].copy_(t)

    def wake(self, named: Any) -> None:
        self.calls.append("wake")
        self.load_weights(named)
        self.calls.pop()

    def sleep(self) -> None:
        self.calls.append("sleep")

    def check_weights(self, reference: dict[str, torch.Tensor]) -> Any:
        return compare_served(dict(self.model.named_parameters()), reference)

    def generate(self, prompts: Any, seed: Any, cfg: SamplingConfig | None = None) -> Any:
        self.calls.append("generate")
        c = cfg or self.cfg
        out = generate(self.model, prompts, max_new_tokens=c.max_new_tokens, steps=c.steps,
                       block_length=c.block_length, temperature=c.temperature, top_k=c.top_k, seed=seed,
                       stop_at_eos=c.stop_at_eos)
        if self.off_by_one:
            out = dataclasses.replace(out, response_ids=(out.response_ids + 1) % 10)
        return out


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def _engine_run(model: Any, algorithm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                consistency_every: int = 0, **fake: Any) -> tuple[Any, list[FakeEngine]]:
    made: list[FakeEngine] = []

    def factory(folder: Path, cfg: SamplingConfig, eos: int, pad: int) -> FakeEngine:
        made.append(FakeEngine(model, cfg, **fake))
        return made[-1]

    monkeypatch.setattr(engine_rollout, "lmdeploy_factory", factory)
    rl = LocalRL(model, prompts=addition_prompts(2, 4, 0), sampling=dataclasses.replace(SAMPLING, engine="lmdeploy"),
                 reward_fn=partial_reward, detokenize=TOK.decode, algorithm=algorithm,
                 optim=OptimConfig(lr=1e-3, grad_clip=1.0),
                 trainer=TrainerConfig(max_steps=1, seed=0, consistency_every=consistency_every),
                 engine_folder=str(_folder(tmp_path)))
    return rl, made


def test_engine_rollouts_equal_native_ones_step_for_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    algorithm = fast(BGPO())
    native = local_rl(tiny_model("sdar"), algorithm, seed=0)
    engine, made = _engine_run(tiny_model("sdar"), algorithm, tmp_path, monkeypatch)
    assert isinstance(engine.rank.rollout, EngineRolloutWorker)
    for step in range(3):
        a, b = native.step(step), engine.step(step)
        assert b["engine_weights_exact"] == 1.0 and b["engine_tensors_checked"] > 0
        assert reproducible(a) == {k: v for k, v in reproducible(b).items() if not k.startswith("engine_")}
    assert len(made) == 1
    assert made[0].calls == ["load", "generate", "sleep"] + ["wake", "generate", "sleep"] * 2


def test_engine_consistency_is_a_greedy_probe_against_native_decoding(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # a faithful engine (the native decoder on the handed-over weights) agrees token for token
    engine, made = _engine_run(tiny_model("sdar"), fast(BGPO()), tmp_path, monkeypatch, consistency_every=1)
    metrics = engine.step(0)
    assert metrics["consistency_probe_token_agreement"] == 1.0
    assert metrics["consistency_probe_common_prefix"] == metrics["consistency_probe_tokens"] == 4.0
    assert metrics["consistency_probe_rows"] == 4.0
    # the probe wakes the engine with the same weights and puts it back to sleep before the update
    assert made[0].calls == ["load", "generate", "sleep", "wake", "generate", "sleep"]
    # an engine that serves the right weights but decodes something else is reported, not hidden
    wrong, _ = _engine_run(tiny_model("sdar"), fast(BGPO()), tmp_path, monkeypatch, consistency_every=1,
                           off_by_one=True)
    bad = wrong.step(0)
    assert bad["engine_weights_exact"] == 1.0
    assert bad["consistency_probe_token_agreement"] == 0.0 and bad["consistency_probe_common_prefix"] == 0.0


def test_a_stale_engine_is_caught_by_the_weights_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, _ = _engine_run(tiny_model("sdar"), fast(BGPO()), tmp_path, monkeypatch, stale=True)
    engine.step(0)
    with pytest.raises(RuntimeError, match="does not serve the policy's weights"):
        engine.step(1)


def test_lora_hands_over_merged_weights_under_release_names() -> None:
    pytest.importorskip("peft")
    model = apply_lora(tiny_model("sdar"), rank=2, alpha=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    plain = dict(tiny_model("sdar").named_parameters())
    from dllm_models import merged_adapters

    with merged_adapters(model):
        weights = release_weights(model)
        assert set(weights) == set(plain)
        changed = [k for k in weights if not torch.equal(weights[k], plain[k])]
    assert changed and all("proj" in k for k in changed)


def test_what_an_engine_cannot_do_is_refused(tmp_path: Path) -> None:
    eng = dataclasses.replace(SAMPLING, engine="lmdeploy", block_diffusion=True)
    folder = _folder(tmp_path)
    with pytest.raises(ValueError, match="set rollout.engine=native"):
        check_engine_support("llada", D1(), eng, folder)
    with pytest.raises(ValueError, match="not one"):
        check_engine_support("sdar", BGPO(), eng, tmp_path / "missing")
    with pytest.raises(ValueError, match="rollout.record_trajectory=true asks for rollout record field 'step_logp'"):
        check_engine_support("sdar", BGPO(), dataclasses.replace(eng, record_trajectory=True), folder)
    check_engine_support("sdar", BGPO(), eng, folder)
    # a threshold on the quota rule is no lmdeploy strategy; DARE's threshold rule is
    with pytest.raises(ValueError, match="rollout.remasking=low_confidence_dynamic"):
        check_engine_support("sdar", BGPO(), dataclasses.replace(eng, threshold=0.9), folder)
    check_engine_support("sdar", BGPO(), dataclasses.replace(eng, threshold=0.9, remasking="low_confidence_dynamic",
                                                            steps=eng.block_length), folder)
    mdpo = MDPO()
    with pytest.raises(ValueError, match="rollout.engine=native"):
        check_engine_support("sdar", mdpo, mdpo.sampling(eng), folder)
    with pytest.raises(ValueError, match="rollout.engine='sglang' unknown"):
        dataclasses.replace(SAMPLING, engine="sglang")

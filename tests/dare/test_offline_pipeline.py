"""SFT, LoRA-SFT and preference recipes end to end through `dare train` on tiny checkpoint folders.

The checkpoints are tiny LLaDA (masked) and SDAR (block) models with the addition task's
character tokenizer; the data are small parquet files of 2-digit sums written here: SFT rows
("12+34=", "046"), preference rows with the sum chosen and "999" (never a sum of two 2-digit
numbers) rejected, a preference even an untrained tiny model learns within a few steps.
"""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

import dare.offline_pipeline
from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import build_model, load_model, save_model
from dllm_train import PhaseSpec
from tests.dllm_models.tiny_configs import tiny_sdar_config
from tests.dare.helpers import measured, tiny_config

TOK = build_tokenizer()


def _sums(count: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, answer) of `count` 2-digit sums."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(count)]
    return [(f"{a:02d}+{b:02d}=", f"{a + b:03d}") for a, b in pairs]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoint folders (`llada`, `sdar`) and parquet files (`sft`, `preference`)."""
    root = tmp_path_factory.mktemp("offline")
    save_model(build_tiny_model(tiny_config(), TOK), root / "llada", tokenizer=TOK)
    ids = {"vocab_size": len(TOK), "mask_token_id": TOK.mask_token_id, "eos_token_id": TOK.eos_token_id,
           "pad_token_id": TOK.pad_token_id}
    sdar = build_model(tiny_sdar_config(**ids))
    sdar.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)  # type: ignore[operator]
    save_model(sdar, root / "sdar", tokenizer=TOK)
    rows = _sums(64, seed=0)
    pq.write_table(pa.table({"prompt": [p for p, _ in rows], "response": [r for _, r in rows]}),
                   root / "sft.parquet")
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": p}] for p, _ in rows],
                             "chosen": [r for _, r in rows], "rejected": ["999"] * len(rows)}),
                   root / "preference.parquet")
    return {"llada": root / "llada", "sdar": root / "sdar", "sft": root / "sft.parquet",
            "preference": root / "preference.parquet"}


def _args(recipe: str, folders: dict[str, Path], out: Path, *extra: str) -> list[str]:
    family, _, algorithm = recipe.partition("-")
    preference = algorithm in ("dpo", "vrpo")  # each kind has its own sections (no sft.* in a preference run)
    data = folders["preference"] if preference else folders["sft"]
    phase = (["preference.pairs_per_step=8", "preference_optim.lr=1e-2"] if preference else
             ["sft.batch_size=16", "sft_optim.lr=3e-3", "sft_optim.warmup_steps=0"])
    return ["train", recipe, f"checkpoint.checkpoint={folders[family]}", "checkpoint.dtype=float32",
            f"data.train_files={data}", *phase, *extra, "--output-dir", str(out), "--no-progress"]


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_sft_lowers_the_loss_and_writes_a_run_folder(family: str, folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    # without the 1/t weight (t down to 1e-3) the per-step loss is steady enough to compare windows
    assert main(_args(f"{family}-sft", folders, out, "sft.steps=40", "sft.weight_by_t=false")) == 0
    losses = [r["loss"] for r in _metrics(out)]
    assert len(losses) == 40
    assert _mean(losses[-10:]) < 0.85 * _mean(losses[:10])
    for name in ("config.json", "summary.json", "curves.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "summary.json").read_text())["steps"] == 40
    assert set(load_model(out / "model").state_dict()) == set(load_model(folders[family]).state_dict())


def test_lora_sft_trains_only_the_adapters(folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(_args("llada-lora-sft", folders, out, "sft.steps=4", "checkpoint.lora_rank=4",
                      "checkpoint.lora_alpha=8")) == 0
    base = load_model(folders["llada"]).state_dict()
    trained = load_file(str(out / "checkpoints" / "0-sft-000004" / "model" / "model.safetensors"))
    adapters = {k: v for k, v in trained.items() if "lora_" in k}
    assert adapters and any(bool(v.abs().sum() > 0) for k, v in adapters.items() if "lora_B" in k)
    frozen = {k.replace(".base_layer", ""): v for k, v in trained.items() if "lora_" not in k}
    assert set(frozen) == set(base)
    assert all(torch.equal(frozen[k], base[k]) for k in base)  # every base weight untouched
    merged = load_model(out / "model").state_dict()  # the export folds the adapters in
    changed = {k for k in base if not torch.equal(merged[k], base[k])}
    assert changed and all(k.replace(".weight", ".base_layer.weight") in trained for k in changed)
    # the adapter alone, in PEFT's format, beside model/: on the base it is the merged model
    from dllm_models.lora import load_peft_adapter

    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["base_model_name_or_path"] == str(folders["llada"])
    applied = load_peft_adapter(load_model(folders["llada"]), out / "adapter").state_dict()
    assert set(applied) == set(merged)
    for k in base:
        torch.testing.assert_close(applied[k], merged[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize(("algorithm", "extra"), [("dpo", "algorithm.mc_num=4"), ("vrpo", "")])
def test_preference_training_raises_the_margin(algorithm: str, extra: str, folders: dict[str, Path],
                                               tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(_args(f"llada-{algorithm}", folders, out, "trainer.max_steps=16", *([extra] if extra else []))) == 0
    records = _metrics(out)
    margins = [r["reward_margin"] for r in records]
    accuracy = [r["pair_accuracy"] for r in records]
    assert _mean(margins[-4:]) > _mean(margins[:4]) + 0.25
    assert _mean(accuracy[-4:]) > max(0.9, _mean(accuracy[:4]))
    assert set(load_model(out / "model").state_dict()) == set(load_model(folders["llada"]).state_dict())


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("recipe", "extra"), [("llada-sft", ""), ("sdar-lora-sft", "checkpoint.lora_rank=4"),
                                              ("llada-vrpo", "")])
def test_resume_after_a_crash_equals_an_uninterrupted_run(recipe: str, extra: str, folders: dict[str, Path],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = ["sft.steps=8" if recipe.endswith("sft") else "trainer.max_steps=8", "trainer.save_every=2",
             *([extra] if extra else [])]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(_args(recipe, folders, straight, *steps)) == 0

    def crashing(**kwargs: Any) -> PhaseSpec:
        inner = kwargs["step_fn"]

        def step(i: int) -> dict[str, float]:
            if i == 5:
                raise _Stop
            return inner(i)  # type: ignore[no-any-return]

        return PhaseSpec(**{**kwargs, "step_fn": step})

    monkeypatch.setattr(dare.offline_pipeline, "PhaseSpec", crashing)
    with pytest.raises(_Stop):
        main(_args(recipe, folders, resumed, *steps))
    assert len(_metrics(resumed)) == 5  # steps 1..5 logged, last checkpoint after step 4
    monkeypatch.undo()
    assert main(_args(recipe, folders, resumed, *steps)) == 0
    assert measured(resumed / "metrics.jsonl") == measured(straight / "metrics.jsonl")  # (without memory peaks)
    a, b = load_model(straight / "model").state_dict(), load_model(resumed / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == 2
    return capsys.readouterr().err


def test_bad_columns_name_the_column_and_the_fix(folders: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["1+1="], "answer": ["002"]}), bad)
    msg = _fails(_args("llada-sft", folders, tmp_path / "a", "sft.steps=1", f"data.train_files={bad}"), capsys)
    assert "missing ['response']" in msg and "rename" in msg.lower() and not (tmp_path / "a").exists()
    msg = _fails(_args("llada-dpo", folders, tmp_path / "b", f"data.train_files={bad}"), capsys)
    assert "missing ['chosen', 'rejected']" in msg


@pytest.mark.parametrize(("override", "needle"), [
    ("sft.normalizer=mean", "sft.normalizer 'mean' unknown"),
    ("checkpoint.lora_rank=0", "set checkpoint.lora_rank=16"),
    ("sft.steps=0", "set sft.steps=N"),
    ("checkpoint.checkpoint=/nonexistent", "is not a model folder"),
    ("algorithm.normalizer=response", "set sft.normalizer instead"),
    ("algorithm.t_rang=[0.3, 0.8]", "algorithm 'lora-sft' has ['t_range']"),
])
def test_bad_config_fails_before_work(override: str, needle: str, folders: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(_args("llada-lora-sft", folders, tmp_path / "x", "checkpoint.lora_rank=4", override), capsys)
    assert needle in msg
    assert not (tmp_path / "x").exists()


def test_preference_on_a_block_checkpoint_fails_before_work(folders: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(_args("llada-dpo", folders, tmp_path / "x", f"checkpoint.checkpoint={folders['sdar']}"), capsys)
    assert "defined for families ['llada', 'dream'], not 'sdar'" in msg
    assert not (tmp_path / "x").exists()


def test_wandb_switch_logs_every_step_offline(folders: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, Any] = {"log": []}
    run = types.SimpleNamespace(define_metric=lambda *a, **k: None, log=calls["log"].append,
                                finish=lambda: calls.setdefault("finished", True))
    fake = types.SimpleNamespace(init=lambda **kw: calls.setdefault("init", kw) and run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    assert main(_args("llada-sft", folders, out, "sft.steps=2", "trainer.wandb=true")) == 0
    assert calls["init"]["mode"] == "offline" and calls["init"]["dir"] == str(out)
    assert calls["init"]["config"]["recipe"] == "llada-sft"
    assert [r["sft/step"] for r in calls["log"]] == [1, 2] and "sft/loss" in calls["log"][0]
    assert calls["finished"]


def test_wandb_switch_without_the_package_says_what_to_install(folders: dict[str, Path], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    msg = _fails(_args("llada-sft", folders, tmp_path / "x", "sft.steps=2", "trainer.wandb=true"), capsys)
    assert "pip install 'dllm-train[wandb]'" in msg and "trainer.wandb=false" in msg
    assert not (tmp_path / "x" / "checkpoints").exists()


def _live_parameter_elements() -> int:
    """Elements of every live parameter tensor (what the process holds in weights)."""
    import gc
    import warnings

    with warnings.catch_warnings():  # (isinstance on some torch module objects warns of deprecations)
        warnings.simplefilter("ignore")
        params = {id(o): o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)}
    return sum(int(p.numel()) for p in params.values())


@pytest.mark.parametrize("lora", [True, False])
def test_a_lora_preference_run_holds_no_second_copy_of_the_model(lora: bool, folders: dict[str, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Under LoRA the reference is the policy's own base weights (the RL assembly's rule); full fine-tuning
    holds a frozen copy. Counted in live parameter elements while the worker trains."""
    import dllm_train.offline as offline

    seen: dict[str, object] = {}
    step = offline.OfflineWorker.step

    def spy(self: offline.OfflineWorker[Any, Any], i: int) -> dict[str, float]:
        if "live" not in seen:
            seen["live"] = _live_parameter_elements()
            seen["model"] = sum(int(p.numel()) for p in self.model.parameters())
            seen["same"] = self.ref_model is self.model
        return step(self, i)

    monkeypatch.setattr(offline.OfflineWorker, "step", spy)
    extra = ["checkpoint.lora_rank=4", "checkpoint.lora_alpha=8"] if lora else []
    assert main(_args("llada-dpo", folders, tmp_path / "run", "trainer.max_steps=1", *extra)) == 0
    live, model = int(seen["live"]), int(seen["model"])  # type: ignore[call-overload]
    # the policy (with its adapters) is everything a LoRA run holds; full fine-tuning holds two models
    assert seen["same"] is lora
    assert (live < 1.5 * model) if lora else (live >= 2 * model - 1), (live, model)
def _rl_args(folders: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["train", "sdar-bgpo", f"checkpoint.checkpoint={folders['sdar']}", "checkpoint.dtype=float32",
            "data.train_files=countdown", *extra, "--output-dir", str(out), "--no-progress"]


def test_a_block_length_other_than_the_models_is_refused_before_work(folders: dict[str, Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # before: sdar-bgpo rollout.block_length=5 ran with the model's 4 while config.json recorded 5
    for args in (_rl_args(folders, tmp_path / "rl", "rollout.block_length=5"),
                 _args("sdar-sft", folders, tmp_path / "sft", "rollout.block_length=5")):
        msg = _fails(args, capsys).strip().splitlines()
        assert not any("Traceback" in line for line in msg) and msg[-1] == (
            f"dare: error: rollout.block_length=5, but {folders['sdar']} is a block-diffusion model with block "
            "size 4: it decodes on the grid its attention mask uses (dare eval refuses another too); set "
            "rollout.block_length=4 or drop the override")
    assert not (tmp_path / "rl").exists() and not (tmp_path / "sft").exists()


def test_an_engine_that_is_not_installed_is_refused_before_work(folders: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # before: two tracebacks, then the reason, with config.json and metrics.jsonl already written
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lmdeploy" else real(name, *a))
    msg = _fails(_rl_args(folders, tmp_path / "x", "rollout.engine=lmdeploy"), capsys).strip().splitlines()
    assert not any("Traceback" in line for line in msg)
    assert msg[-1] == ("dare: error: rollout.engine=lmdeploy needs the lmdeploy extra, which is not installed: "
                       "pip install 'dllm-rollout[lmdeploy]', or set rollout.engine=native")
    assert not (tmp_path / "x").exists()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "lmdeploy" else real(name, *a))
    msg = _fails(_rl_args(folders, tmp_path / "x", "rollout.engine=lmdeploy", "algorithm=cj-grpo"), capsys)
    assert msg.strip().splitlines()[-1] == (  # what the engine cannot record
        "dare: error: algorithm CJGRPO needs rollout record field 'unmask_step', which rollout.engine=lmdeploy does "
        "not fill; use rollout.engine=native")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("recipe", "field"), [("llada-mdpo", "step_canvas"), ("llada-dmpo", "ref_step_logp"),
                                               ("llada-cj-grpo", "unmask_step")])
def test_a_record_field_the_engine_does_not_fill_is_refused_before_loading(
        recipe: str, field: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one rule for every algorithm and engine (dllm_train.check_rollout_record), before the policy's weights load
    # and whether or not the engine is installed
    import dare.pipeline

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr(dare.pipeline, "policy_with_adapters", no_load)
    args = ["train", recipe, f"checkpoint.checkpoint={folders['llada']}", "checkpoint.dtype=float32",
            "data.train_files=countdown", "rollout.engine=lmdeploy", "--output-dir", str(tmp_path / "x"),
            "--no-progress"]
    msg = _fails(args, capsys).strip().splitlines()
    name = {"llada-mdpo": "MDPO", "llada-dmpo": "DMPO", "llada-cj-grpo": "CJGRPO"}[recipe]
    assert not any("Traceback" in line for line in msg)
    assert msg[-1] == (f"dare: error: algorithm {name} needs rollout record field {field!r}, which "
                       "rollout.engine=lmdeploy does not fill; use rollout.engine=native")
    assert not (tmp_path / "x").exists()

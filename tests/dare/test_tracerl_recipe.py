"""TraceRL's recipes: `dare show` gives its authors' config values (Gen-Verse/dLLM-RL at 10b4fd1,
configs/rl_sdar.yaml, rl_llada.yaml, rl_dream.yaml) and `dare train <family>-tracerl` runs a step at toy size."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dare.cli import main


def _shown(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    return {line.split(" = ")[0].strip(): re.split(r"\s{2,}", line.split(" = ", 1)[1].strip())[0]
            for line in capsys.readouterr().out.splitlines() if " = " in line}


def test_show_gives_the_authors_sdar_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "sdar-tracerl"]) == 0
    out = capsys.readouterr().out
    # the sources block names each default's line of the authors' config (or the reason)
    assert "  rl.group_size: 16  Gen-Verse/dLLM-RL@10b4fd1 `configs/rl_sdar.yaml:37`: `num_response_per_task: 16`" in out
    assert "  rollout.top_k: null  **ours**: top_k: 0 (configs/rl_sdar.yaml:43) turns the filter off" in out
    print(out)
    lines = _shown(capsys)
    authors = {  # configs/rl_sdar.yaml at 10b4fd1
        "rl.prompts_per_step": "64",  # :36 num_task_per_step
        "rl.group_size": "16",  # :37 num_response_per_task
        "rollout.temperature": "1.0",  # :38
        "rollout.max_new_tokens": "2000",  # :39 max_token
        "rollout.block_length": "4",  # :40 block_size
        "rollout.steps": "4",  # :41 denoising_steps_per_block
        "rollout.top_p": "1.0",  # :42
        "rollout.top_k": "null",  # :43 top_k: 0 (off)
        "rollout.remasking": '"low_confidence_dynamic"',  # :44
        "rollout.threshold": "0.9",  # :45 dynamic_threshold
        "rl_optim.grad_clip": "1.0",  # :59 max_grad_norm
        "algorithm.shrink": "1",  # :62
        "data.max_prompt_length": "784",  # :65
        "algorithm.clip": "0.2",  # :68 eps
        "algorithm.kl_coef": "0.01",  # :69 beta
        "rl_optim.lr": "1e-06",  # :76
        "rl_optim.betas": "[0.9, 0.999]",  # :78-79
        "rl_optim.weight_decay": "0.0",  # :80
    }
    assert {k: lines[k] for k in authors} == authors


@pytest.mark.parametrize(("family", "shrink", "steps", "tokens"), [("llada", "8", "512", "512"),
                                                                   ("dream", "8", "1024", "1024")])
def test_show_gives_the_authors_masked_configs(family: str, shrink: str, steps: str, tokens: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", f"{family}-tracerl"]) == 0
    lines = _shown(capsys)
    assert (lines["algorithm.shrink"], lines["rollout.steps"], lines["rollout.max_new_tokens"]) == (shrink, steps, tokens)
    assert (lines["rl.prompts_per_step"], lines["rl.group_size"], lines["rollout.temperature"]) == ("32", "8", "0.8")
    assert (lines["rollout.block_length"], lines["data.max_prompt_length"]) == ("32", "512")


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny SDAR and LLaDA checkpoints with the addition task's tokenizer, and an RL parquet file."""
    import torch

    from dare.tasks.addition import build_tokenizer
    from dllm_models import build_model, save_model
    from tests.conftest import tiny_llada_config
    from tests.dare.helpers import addition_rl_parquet
    from tests.dllm_models.tiny_configs import tiny_sdar_config

    tok = build_tokenizer()
    root = tmp_path_factory.mktemp("tracerl")
    ids = {"vocab_size": len(tok), "mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id,
           "pad_token_id": tok.pad_token_id}
    out = {}
    for family, cfg in (("sdar", tiny_sdar_config(**ids)), ("llada", tiny_llada_config(**ids))):
        model = build_model(cfg)
        model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)  # type: ignore[operator]
        save_model(model, root / family, tokenizer=tok)
        out[family] = root / family
    pairs = [(12, 34), (5, 71), (40, 40), (9, 9)]
    addition_rl_parquet(root / "rl.parquet", pairs)
    out["rl"] = root / "rl.parquet"
    return out


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_tracerl_recipe_runs_a_step_at_toy_size(family: str, tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    # the group filter keeps groups with mean score in [0, 1] here: an untrained model scores 0 everywhere
    assert main(["train", f"{family}-tracerl", f"checkpoint.checkpoint={tiny_checkpoints[family]}",
                 "checkpoint.dtype=float32", f"data.train_files={tiny_checkpoints['rl']}", "data.max_prompt_length=64",
                 "rollout.max_new_tokens=8", "rollout.steps=8" if family == "llada" else "rollout.steps=4",
                 "rollout.block_length=4", "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=1",
                 "algorithm.shrink=2", "algorithm.min_group_accuracy=0", "algorithm.max_group_accuracy=1",
                 "--output-dir", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == f"{family}-tracerl" and summary["steps"] >= 1
    config = json.loads((out / "config.json").read_text())
    assert config["algorithm"]["shrink"] == 2
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = steps[-1]  # TraceRL's own metrics (trace_policy_loss) reached the run's log
    assert {"policy_loss", "kl", "clip_frac"} <= set(last) and last["optimizer_steps"] >= 1, sorted(last)


def test_show_gives_the_authors_with_value_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "sdar-tracerl-value"]) == 0
    out = capsys.readouterr().out
    assert ("  algorithm.value_lr: 5e-06  Gen-Verse/dLLM-RL@10b4fd1 `configs/rl_sdar_with_value.yaml:79`: "
            "`value_learning_rate: 5e-6`") in out
    print(out)
    lines = _shown(capsys)
    authors = {  # configs/rl_sdar_with_value.yaml at 10b4fd1 (and rl.py:21-22 for the value model)
        "algorithm.value_model": "true",  # :22 value_base_model set
        "algorithm.value_every": "1",  # :14 train_value_every
        "rl.prompts_per_step": "64",  # :38
        "rl.group_size": "16",  # :39
        "rollout.max_new_tokens": "2000",  # :41 max_token
        "rl_optim.grad_clip": "1.0",  # :61 max_grad_norm
        "algorithm.shrink": "1",  # :64
        "algorithm.clip": "0.2",  # :68 eps
        "algorithm.value_clip": "0.2",  # :68 eps (train/train_sdar_value.py:998)
        "algorithm.kl_coef": "0.01",  # :69 beta
        "algorithm.gamma": "1.0",  # :70 gam
        "algorithm.lam": "1.0",  # :71
        "rl_optim.lr": "1e-06",  # :78 policy_learning_rate
        "algorithm.value_lr": "5e-06",  # :79 value_learning_rate
    }
    assert {k: lines[k] for k in authors} == authors
    assert main(["show", "sdar_moe-tracerl-value"]) == 0  # TraDo's MoE checkpoints: the same config
    with pytest.raises(SystemExit):  # the authors train no value model for their masked-model trainers
        main(["show", "llada-tracerl-value"])


def _value_run(tiny: dict[str, Path], out: Path, steps: int, *extra: str) -> int:
    return main(["train", "sdar-tracerl-value", f"checkpoint.checkpoint={tiny['sdar']}", "checkpoint.dtype=float32",
                 f"data.train_files={tiny['rl']}", "data.max_prompt_length=64", "rollout.max_new_tokens=8",
                 "rollout.steps=4", "rollout.block_length=4", "rl.prompts_per_step=2", "rl.group_size=4",
                 "rl_optim.lr=1e-3", "algorithm.value_lr=1e-2", "algorithm.min_group_accuracy=0",
                 "algorithm.max_group_accuracy=1", f"trainer.max_steps={steps}", "trainer.save_every=1",
                 *extra, "--output-dir", str(out), "--no-progress"])


def _text_reward(self: object, text: str, key: str) -> float:
    """A reward that differs between the samples of a group (an untrained model solves no sum): a gradient."""
    return float(sum(map(ord, text)) % 2)


def test_tracerl_value_recipe_trains_both_models_and_resumes_exactly(
        tiny_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import dare.pipeline
    from dllm_models import load_model
    from tests.dare.helpers import measured

    monkeypatch.setattr(dare.pipeline.RowReward, "__call__", _text_reward)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _value_run(tiny_checkpoints, straight, 3) == 0
    assert _value_run(tiny_checkpoints, resumed, 2) == 0
    assert _value_run(tiny_checkpoints, resumed, 3) == 0  # the same folder again: resumes after its step-2 checkpoint
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(r["value_optimizer_steps"] == 1.0 and r["optimizer_steps"] == 1.0 for r in records), records
    assert records[-1]["value_loss"] > 0 and records[-1]["value_grad_norm"] > 0
    assert measured(resumed / "metrics.jsonl") == measured(straight / "metrics.jsonl")  # (without timings)
    # the policy: the export of both runs
    a, b = load_model(straight / "model").state_dict(), load_model(resumed / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the value model: its weights and optimizer state in every checkpoint, equal after the resume
    owners = {}
    for run in (straight, resumed):
        ckpt = sorted((run / "checkpoints").iterdir())[-1]
        assert ckpt.name == "0-rl-000003"
        owners[run] = torch.load(ckpt / "trainer_state.pt", weights_only=True)["owner"]["critic"]
    s, r = owners[straight], owners[resumed]
    assert s["updates"] == r["updates"] == 3 and s["optimizer"]["state"]
    assert set(s["model"]) == set(r["model"]) and all(torch.equal(s["model"][k], r["model"][k]) for k in s["model"])
    for k, state in s["optimizer"]["state"].items():
        assert all(torch.equal(v, r["optimizer"]["state"][k][n]) for n, v in state.items())
    assert s["model"]["value_head.weight"].abs().sum() > 0  # trained away from its zero start
    backbone = {k.removeprefix("backbone."): v for k, v in s["model"].items() if k.startswith("backbone.")}
    start = load_model(tiny_checkpoints["sdar"]).state_dict()
    assert set(backbone) == set(start) and any(not torch.equal(backbone[k], start[k]) for k in start)
    assert any(not torch.equal(backbone[k], a[k]) for k in a)  # the critic is its own copy, not the policy


def test_tracerl_value_refuses_the_ray_backend_and_lora(tiny_checkpoints: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        _value_run(tiny_checkpoints, tmp_path / "run", 1, "trainer.backend=ray")
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "trainer.backend='ray'" in message and "set trainer.backend=local" in message, message
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit) as err:  # a full copy of the policy beside LoRA adapters: refused too
        _value_run(tiny_checkpoints, tmp_path / "run", 1, "checkpoint.lora_rank=8")
    assert err.value.code == 2 and "set checkpoint.lora_rank=0" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()

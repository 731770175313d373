"""`dare eval` checks its arguments before it loads a model, lists its catalogue, takes the weights'
fingerprint once per model and evaluates a PEFT adapter on its base."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import dllm_eval
import dllm_eval.manifest
import dllm_models
from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import save_model
from tests.dare.helpers import tiny_config

FAST = ["--max-new-tokens", "8", "--steps", "8", "--block-length", "8", "--batch-size", "2"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_model(build_tiny_model(tiny_config(), tok), path, tokenizer=tok)
    return path


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(dllm_models, "load_model", refuse)


@pytest.mark.parametrize("words, message", [
    (["--benchmarks", "gsm8kk"], "--benchmarks: unknown benchmark 'gsm8kk' (did you mean 'gsm8k'?)"),
    (["--benchmarks", "gsm8k,mat500"], "unknown benchmark 'mat500' (did you mean 'math500'?)"),
    (["--preset", "dare_locl"], "--preset: unknown preset 'dare_locl' (did you mean 'dare_local'?)"),
    (["--reward-mode", "dar"], "--reward-mode 'dar' unknown (did you mean 'dare'?)"),
    (["--limit", "0"], "--limit must be >= 1, got 0 (leave --limit out to evaluate every row)"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--steps", "-1"], "--steps must be >= 1, got -1"),
    (["--benchmarks", ","], "--benchmarks is empty"),
    (["--max-new-tokens", "10", "--block-length", "4"], "--max-new-tokens 10 must be a multiple of --block-length 4"),
])
def test_bad_arguments_fail_before_the_model_loads(tiny_checkpoint: Path, tmp_path: Path, no_load: None,
                                                   capsys: pytest.CaptureFixture[str], words: list[str],
                                                   message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", str(tiny_checkpoint), *words, "--output-dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dare: error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_list_prints_benchmarks_and_presets_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--list"])  # no checkpoint needed
    assert exit_.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for name, item in [*dllm_eval.BENCHMARKS.items(), *dllm_eval.PRESETS.items()]:
        line = [x for x in lines if x.split()[:1] == [name]]
        assert len(line) == 1 and item.summary and item.summary in line[0], name


def test_one_fingerprint_per_model_for_every_benchmark(tiny_checkpoint: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = dllm_eval.manifest.weights_fingerprint

    def counted(model: Any) -> str | None:
        calls.append("fingerprint")
        return real(model)

    def slow_hash(model: Any) -> str | None:
        calls.append("sha256")
        return None

    monkeypatch.setattr(dllm_eval.manifest, "weights_fingerprint", counted)
    monkeypatch.setattr(dllm_eval, "weights_fingerprint", counted)
    monkeypatch.setattr(dllm_eval.manifest, "weights_hash", slow_hash)
    code = main(["eval", str(tiny_checkpoint), "--benchmarks", "gsm8k,countdown", "--preset", "dare_local,d1",
                 "--limit", "1", *FAST, "--output-dir", str(tmp_path)])
    assert code == 0 and calls == ["fingerprint"]  # 2 presets x 2 benchmarks, one model
    prints = {json.loads((tmp_path / p / b / "manifest.json").read_text())["weights_fingerprint"]
              for p in ("dare_local", "d1") for b in ("gsm8k", "countdown")}
    assert len(prints) == 1 and next(iter(prints)).startswith("mix32-v1:")


def test_adapter_on_the_base_evaluates_as_the_merged_model(tiny_checkpoint: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("peft")
    from dllm_models import load_model, load_tokenizer
    from dllm_models.lora import apply_lora, merge_lora, save_peft_adapter

    base = load_model(str(tiny_checkpoint))
    model = apply_lora(copy.deepcopy(base), rank=2, alpha=4, target_modules=["q_proj", "ff_proj"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    save_peft_adapter(model, tmp_path / "adapter")
    save_model(merge_lora(copy.deepcopy(model)), tmp_path / "merged", tokenizer=load_tokenizer(str(tiny_checkpoint)))
    args = ["--benchmarks", "countdown", "--preset", "d1", "--limit", "4", *FAST]
    assert main(["eval", str(tiny_checkpoint), "--adapter", str(tmp_path / "adapter"), *args,
                 "--output-dir", str(tmp_path / "a")]) == 0
    assert f"model {tiny_checkpoint} with the LoRA adapter {tmp_path / 'adapter'} loaded" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "merged"), *args, "--output-dir", str(tmp_path / "m")]) == 0
    assert main(["eval", str(tiny_checkpoint), *args, "--output-dir", str(tmp_path / "b")]) == 0

    def responses(out: str) -> list[str]:
        return [json.loads(x)["response"] for x in (tmp_path / out / "countdown" / "samples.jsonl").read_text().splitlines()]

    assert responses("a") == responses("m") and len(responses("a")) == 4
    manifest = json.loads((tmp_path / "a" / "countdown" / "manifest.json").read_text())
    assert manifest["adapter"] == str(tmp_path / "adapter")
    assert manifest["weights_fingerprint"] != json.loads((tmp_path / "b" / "countdown" / "manifest.json").read_text())[
        "weights_fingerprint"]


def test_an_adapter_with_another_engine_is_refused(tiny_checkpoint: Path, tmp_path: Path, no_load: None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", str(tiny_checkpoint), "--adapter", str(tmp_path), "--engine", "lmdeploy",
              "--output-dir", str(tmp_path / "o")])
    assert "--adapter works with the native engine only" in capsys.readouterr().err


def test_a_missing_adapter_fails_before_the_model_loads(tiny_checkpoint: Path, tmp_path: Path, no_load: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", str(tiny_checkpoint), "--adapter", str(tmp_path), "--output-dir", str(tmp_path / "o")])
    assert "lacks adapter_config.json" in capsys.readouterr().err


def test_the_opencompass_harness_gets_the_decoding_overrides(tiny_checkpoint: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_eval.opencompass.driver as driver

    calls: list[dict[str, Any]] = []

    def fake(checkpoint: Any, benchmarks: Any, **kwargs: Any) -> int:
        calls.append(kwargs)
        return 0

    monkeypatch.setattr(driver, "run_opencompass", fake)
    assert main(["eval", str(tiny_checkpoint), "--harness", "opencompass", "--benchmarks", "gsm8k",
                 "--max-new-tokens", "16", "--steps", "8", "--seed", "3", "--output-dir", str(tmp_path)]) == 0
    assert calls[0]["decoding"] == {"max_new_tokens": 16, "steps": 8} and calls[0]["seed"] == 3

"""Runner with a fake deterministic generator: outputs, manifest, batch-size invariance."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from dllm_models.registry import FAMILY_NAMES, get_family
from dllm_rollout import SamplingConfig

from dllm_eval import get_benchmark, infer_family, render_table, rescore, run_benchmark

EOS = 0


class CharTokenizer:
    """Character-level stand-in for a HF tokenizer (id = code point, 0 = EOS)."""

    eos_token_id = EOS
    chat_template = "{role}: {content}\n"

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant: "
        return [ord(c) for c in text]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        return "".join(("<eos>" if not skip_special_tokens else "") if t == EOS else chr(t)
                       for t in token_ids)


def make_fake_generate(answers: dict[str, str]) -> Any:
    """Answers correctly for prompts whose text contains a key, wrongly otherwise."""
    calls: list[int] = []

    def generate(model: Any, prompts: list[list[int]], cfg: SamplingConfig, *, seed: Any) -> Any:
        calls.append(len(prompts))
        max_new_tokens = cfg.max_new_tokens
        out = torch.full((len(prompts), max_new_tokens), EOS, dtype=torch.long)
        for i, ids in enumerate(prompts):
            text = "".join(chr(t) for t in ids)
            answer = next((a for q, a in answers.items() if q in text), "0")
            resp = [ord(c) for c in f"<reasoning>r</reasoning>\\boxed{{{answer}}}"]
            resp = resp[:max_new_tokens]
            out[i, : len(resp)] = torch.tensor(resp)
            out[i, len(resp):] = EOS
        return SimpleNamespace(response_ids=out)

    generate.calls = calls  # type: ignore[attr-defined]
    return generate


def _answers(limit: int) -> dict[str, str]:
    rows = get_benchmark("gsm8k").load(limit=limit)
    # every third question answered right
    return {r.prompt[0]["content"][:80]: r.ground_truth for r in rows if r.index % 3 == 0}


def test_scores_invariant_to_batch_size(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    results = []
    for bs in (1, 3, 10):
        gen = make_fake_generate(_answers(10))
        res = run_benchmark(model, CharTokenizer(), "gsm8k", batch_size=bs, limit=10,
                            generate_fn=gen, output_dir=tmp_path / f"bs{bs}")
        assert gen.calls == [min(bs, 10 - i) for i in range(0, 10, bs)]
        results.append(res)
    base = [(s.index, s.score, s.response) for s in results[0].samples]
    for res in results[1:]:
        assert [(s.index, s.score, s.response) for s in res.samples] == base
    assert results[0].accuracy == 0.4  # indices 0, 3, 6, 9


def test_outputs_and_manifest(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    res = run_benchmark(model, CharTokenizer(), "gsm8k", preset="d1", batch_size=4, limit=6,
                        seed=7, generate_fn=make_fake_generate(_answers(6)), output_dir=tmp_path)
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["score"] == 1.0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["decoding"] == dataclasses.asdict(SamplingConfig(max_new_tokens=256, steps=128, block_length=32))
    assert {k: manifest["decoding"][k] for k in ("max_new_tokens", "steps", "block_length", "temperature",
                                                 "remasking", "threshold", "cache", "top_p")} == {
        "max_new_tokens": 256, "steps": 128, "block_length": 32, "temperature": 0.0,
        "remasking": "low_confidence", "threshold": None, "cache": None, "top_p": None}
    assert manifest["seed"] == 7 and manifest["preset"] == "d1"
    assert manifest["reward_mode"] == "d1" and manifest["assistant_prefill"] == "<reasoning>"
    assert len(manifest["prompt_template_hash"]) == 64
    assert manifest["weights_fingerprint"].startswith("mix32-v1:") and len(manifest["weights_fingerprint"]) == 73
    assert manifest["packages"]["dllm-eval"] is not None
    assert "skip_special_tokens=False" in manifest["eos_handling"] and manifest["instruction"]
    assert json.loads(lines[0])["response"].endswith("<eos>")  # d1 decodes every token
    assert "| gsm8k | d1 | d1 | 6 |" in render_table([res])
    assert (tmp_path / "results.md").exists()


def test_prompt_hash_changes_with_preset(tmp_path: Path) -> None:
    gen = make_fake_generate({})
    a = run_benchmark(None, CharTokenizer(), "gsm8k", limit=2, generate_fn=gen)
    b = run_benchmark(None, CharTokenizer(), "gsm8k", preset="d1", limit=2, generate_fn=gen)
    assert a.manifest["prompt_template_hash"] != b.manifest["prompt_template_hash"]
    assert a.manifest["weights_fingerprint"] is None and a.accuracy == 0.0


def test_d1_prompt_is_template_plus_prefill() -> None:
    seen: list[str] = []

    def generate(model: Any, prompts: list[list[int]], cfg: SamplingConfig, *, seed: Any) -> Any:
        seen.extend("".join(chr(t) for t in p) for p in prompts)
        return SimpleNamespace(response_ids=torch.zeros(len(prompts), cfg.max_new_tokens,
                                                        dtype=torch.long))

    res = run_benchmark(None, CharTokenizer(), "sudoku", preset="d1_128", limit=2,
                        generate_fn=generate)
    # d1 evaluates its seed-42 subset: rows 361 and 73 of the 500, in that order
    assert [s.index for s in res.samples] == [361, 73]
    assert seen[0].startswith("user: \nPlease solve the following 4x4 Sudoku puzzle.")
    assert seen[0].endswith("Solve the following Sudoku puzzle: 4320004330100004\n\n"
                            "assistant: <reasoning>")
    assert res.manifest["decoding"]["max_new_tokens"] == 128
    assert res.manifest["decoding"]["steps"] == 64


def test_length_filter_repeats_and_family_decoding() -> None:
    calls: list[dict[str, Any]] = []

    def generate(model: Any, prompts: list[list[int]], cfg: SamplingConfig, *, seed: Any) -> Any:
        calls.append({"n": len(prompts), **dataclasses.asdict(cfg), "seed": seed})
        return SimpleNamespace(response_ids=torch.zeros(len(prompts), cfg.max_new_tokens,
                                                        dtype=torch.long))

    # dare_local drops prompts over 512 tokens (chars here); rows 0..9 of GSM8K are shorter
    lengths = [len(CharTokenizer().apply_chat_template(r.prompt))
               for r in get_benchmark("gsm8k").load(limit=10)]
    res = run_benchmark(None, CharTokenizer(), "gsm8k", preset="dare_local", limit=10,
                        generate_fn=generate, family="dream", batch_size=10)
    assert res.manifest["num_dropped_overlong"] == sum(n > 512 for n in lengths)
    assert calls[0]["temperature"] == 0.2 and calls[0]["top_p"] == 0.95  # Dream in DARE
    assert calls[0]["cache"] == "prefix" and res.reward_mode == "dare"
    calls.clear()
    res = run_benchmark(None, CharTokenizer(), "aime2024", preset="dare_opencompass", limit=2,
                        generate_fn=generate, batch_size=16, seed=5)
    assert len(res.samples) == 16 and [s.repeat for s in res.samples[:8]] == list(range(8))
    assert calls[0]["seed"] == [5 + 0 * 8 + r for r in range(8)] + [5 + 1 * 8 + r for r in range(8)]
    assert calls[0]["temperature"] == 1.0 and calls[0]["block_length"] == 64
    assert calls[0]["cache"] == "dual"


def test_rescore_reports_another_reward_mode() -> None:
    rows = get_benchmark("gsm8k").load(limit=2)
    # an unreduced fraction for an integer answer: math-verify accepts it, DARE's grader does not
    answers = {r.prompt[0]["content"][:80]: f"\\frac{{{2 * int(r.ground_truth)}}}{{2}}"
               for r in rows}
    res = run_benchmark(None, CharTokenizer(), "gsm8k", preset="dare_local", limit=2,
                        generate_fn=make_fake_generate(answers), reward_mode="default")
    dare = rescore(res, "dare")
    assert res.accuracy == 1.0 and dare.accuracy == 0.0
    assert dare.reward_mode == "dare" and dare.manifest["reward_mode"] == "dare"
    assert [s.response for s in dare.samples] == [s.response for s in res.samples]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_infer_family_reads_the_registry_name_from_traits(name: str) -> None:
    from tests.dllm_models.tiny_configs import build_tiny

    # sdar_moe contains "sdar": a substring guess on traits.family said "sdar"
    assert infer_family(build_tiny(get_family(name).model_types[0])) == name


def test_infer_family_falls_back_only_without_traits() -> None:
    class DreamLookingName:
        traits = SimpleNamespace(family="llada")

    class LLaDAModelLM:
        pass

    assert infer_family(DreamLookingName()) == "llada"  # traits win over the class name
    assert infer_family(SimpleNamespace(config=SimpleNamespace(model_type="llada2_moe"))) == "llada2"
    assert infer_family(SimpleNamespace(config=SimpleNamespace(model_type="Dream"))) == "dream"
    assert infer_family(SimpleNamespace(config=SimpleNamespace(model_type="sdar_moe"))) == "sdar_moe"
    assert infer_family(LLaDAModelLM()) == "llada"
    assert infer_family(SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))) is None


def test_the_manifest_records_the_models_decoding_mode() -> None:
    seen: list[SamplingConfig] = []

    def generate(model: Any, prompts: list[list[int]], cfg: SamplingConfig, *, seed: Any) -> Any:
        seen.append(cfg)
        return SimpleNamespace(response_ids=torch.zeros(len(prompts), cfg.max_new_tokens, dtype=torch.long))

    block_model = SimpleNamespace(traits=SimpleNamespace(block_length=32, family="llada2"))
    res = run_benchmark(block_model, CharTokenizer(), "gsm8k", preset="d1", limit=1, generate_fn=generate,
                        hash_weights=False)
    assert seen[0].block_diffusion and res.manifest["decoding"]["block_diffusion"] is True
    # d1's 256 tokens in 128 steps (two a step) on LLaDA2's grid of 32: 16 steps per block, the prefix cache
    d1 = get_benchmark("gsm8k").decoding("d1")
    assert (d1.max_new_tokens, d1.steps, d1.block_length) == (256, 128, 32)
    assert seen[0] == dataclasses.replace(d1, steps=16, cache="prefix", block_diffusion=True)
    assert res.manifest["decoding"]["steps"] == 16
    masked = run_benchmark(SimpleNamespace(traits=SimpleNamespace(block_length=None, family="llada")),
                           CharTokenizer(), "gsm8k", preset="d1", limit=1, generate_fn=generate, hash_weights=False)
    assert masked.manifest["decoding"]["block_diffusion"] is False


def test_responses_are_cut_at_the_models_stop_ids() -> None:
    """An SDAR chat model ends its turn with <|im_end|>, which its tokenizer's eos_token_id does not name:
    the text after any of the model's stop ids (`traits.stop_ids`) is not scored."""
    im_end = ord("|")

    def generate(model: Any, prompts: list[list[int]], cfg: SamplingConfig, *, seed: Any) -> Any:
        text = [ord(c) for c in "\\boxed{1}"] + [im_end] + [ord(c) for c in "\\boxed{2}"]
        out = torch.full((len(prompts), cfg.max_new_tokens), EOS, dtype=torch.long)
        out[:, :len(text)] = torch.tensor(text)
        return SimpleNamespace(response_ids=out)

    chat = SimpleNamespace(traits=SimpleNamespace(block_length=None, stop_ids=(EOS, im_end)))
    cut = run_benchmark(chat, CharTokenizer(), "gsm8k", limit=2, generate_fn=generate, family="llada",
                        hash_weights=False)
    assert [s.response for s in cut.samples] == ["\\boxed{1}"] * 2
    assert "[0, 124]" in cut.manifest["eos_handling"]
    plain = SimpleNamespace(traits=SimpleNamespace(block_length=None, stop_ids=(EOS,)))
    whole = run_benchmark(plain, CharTokenizer(), "gsm8k", limit=2, generate_fn=generate, family="llada",
                          hash_weights=False)
    assert [s.response for s in whole.samples] == ["\\boxed{1}|\\boxed{2}"] * 2


def test_run_benchmark_decodes_an_sdar_model_with_a_presets_masked_settings() -> None:
    """`run_benchmark(model, tok, "gsm8k")` on a block model: the preset (block 32, total steps) is moved onto
    the model's grid (before, it raised: block_length 32 is not SDAR's 4)."""
    from tests.tiny_rl import TOK, tiny_model

    model = tiny_model("sdar")
    block = int(model.traits.block_length)
    res = run_benchmark(model, TOK, "gsm8k", preset="dare_local", limit=1, hash_weights=False,
                        filter_overlong=False)
    d = res.manifest["decoding"]
    assert d["block_diffusion"] is True and d["block_length"] == block and len(res.samples) == 1
    # dare_local's gsm8k: 512 tokens in 512 steps, one a step: `block` steps per block
    assert (d["max_new_tokens"], d["steps"], d["cache"]) == (512, block, "prefix")

"""End to end: a tiny checkpoint evaluated by OpenCompass in the separate envs/opencompass project.

Runs ``dllm_eval.opencompass.run_opencompass`` (``uv run --project envs/opencompass --locked``,
fully offline) on two rows of GSM8K and MBPP (multi-turn prompt with a pre-filled assistant
turn, code reward in the sandbox), then checks the results table, the manifest, and that
OpenCompass's predictions equal the native runner's on the same checkpoint (sampled decoding
with per-sample seeds, so prompts, seeds and decoding must all match).

CI: ``uv sync --project envs/opencompass --locked`` first (else the test's ``uv run`` syncs),
then ``uv run pytest -m opencompass tests/integration/test_opencompass.py``.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.opencompass,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(shutil.which("uv") is None,
                       reason="uv is not on PATH: the OpenCompass harness runs through "
                              "`uv run --project envs/opencompass`"),
]

EOS, MASK = "<|endoftext|>", "<|mdm_mask|>"
DECODING: dict[str, Any] = {"max_new_tokens": 16, "steps": 8, "block_length": 8, "temperature": 1.0}
BENCHMARKS = ["gsm8k", "mbpp"]
LIMIT = 2


def _tokenizer() -> Any:
    """A real char-level transformers tokenizer over printable ASCII, with a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(string.printable)}
    vocab[EOS] = len(vocab)
    vocab[MASK] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, mask_token=MASK)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n"
                         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def _checkpoint(path: Path) -> Path:
    from dllm_models import build_model, save_model

    tok = _tokenizer()
    raw = {
        "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 32, "n_layers": 2,
        "n_heads": 2, "n_kv_heads": 2, "mlp_hidden_size": 64, "vocab_size": len(tok),
        "embedding_size": len(tok), "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "max_sequence_length": 4096, "mask_token_id": tok.mask_token_id,
        "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
        "torch_dtype": "float32",
    }
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.5)  # type: ignore[operator]
    return save_model(model, path, tokenizer=tok)


def test_opencompass_end_to_end(tmp_path: Path) -> None:
    from dllm_eval.opencompass import run_opencompass

    ckpt = _checkpoint(tmp_path / "tiny-llada")
    out = tmp_path / "oc"
    rc = run_opencompass(ckpt, BENCHMARKS, preset="dare_local", limit=LIMIT, output_dir=out,
                         batch_size=2, seed=0, decoding=DECODING, locked=True)
    assert rc == 0

    rows = json.loads((out / "results.json").read_text())
    assert [(r["benchmark"], r["preset"]) for r in rows] == [(b, "dare_local") for b in BENCHMARKS]
    for r in rows:
        assert r["n"] == LIMIT
        assert isinstance(r["accuracy"], float) and 0.0 <= r["accuracy"] <= 100.0
        assert isinstance(r["score"], float) and 0.0 <= r["score"] <= 100.0
        assert r["decoding"]["max_new_tokens"] == DECODING["max_new_tokens"]
    assert "| gsm8k | dare_local |" in (out / "results.md").read_text()

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["harness"] == "opencompass" and manifest["opencompass_version"]
    run = manifest["runs"]["gsm8k-dare_local"]
    assert run["num_samples"] == LIMIT and run["weights_sha256"]

    # OpenCompass predictions equal the native runner's (same prompts, seeds and decoding).
    from dllm_eval import run_benchmark
    from dllm_eval.opencompass.configs import decoding_for
    from dllm_models import load_model, load_tokenizer

    model, tok = load_model(ckpt), load_tokenizer(ckpt)
    for r in rows:
        details = json.loads(Path(r["results_file"]).read_text())["details"]
        oc_preds = [d["prediction"][0] for d in details]
        # the decoding the OpenCompass model ran: the preset's (dare_local decodes with the prefix
        # cache) with the test's overrides
        native = run_benchmark(model, tok, r["benchmark"], preset="dare_local", limit=LIMIT,
                               batch_size=1, seed=0, decoding=decoding_for(r["benchmark"], "dare_local", DECODING, checkpoint=ckpt),
                               hash_weights=False, filter_overlong=False)  # OC keeps every row
        assert oc_preds == [s.response for s in native.samples], r["benchmark"]
        assert native.manifest["prompt_template_hash"] == \
            manifest["runs"][f"{r['benchmark']}-dare_local"]["prompt_template_hash"]
        assert [d["score"][0] for d in details] == [s.score for s in native.samples]

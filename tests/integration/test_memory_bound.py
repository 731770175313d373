"""A tiny SDAR folder with SDAR's full 151,936-token vocabulary trains LoRA-SFT and RL on CPU in
a few GB of resident memory.

The model is tiny (2 layers, width 64: about 20 M parameters, most of them the embeddings and
the head); what a pass costs is its [tokens, vocabulary] logits. Each run goes through `dare
train` in a child process under an address-space cap (so a regression fails fast instead of
filling a shared machine) and must stay under `BOUND_GIB` of resident memory.

Why 4 GiB: the process holds torch and transformers (~0.7 GiB), the model, its gradients and
AdamW state (~0.3 GiB), and a few float32 temporaries of one head chunk
(`dllm_models.logprob.LOGITS_CHUNK_ELEMENTS`, 256 MiB each); the runs measure about 2 GiB. The
padded BD3LM path held one full-width row of float32 logits per noised block: at these lengths
(450-token SFT rows, 63 noised blocks) tens of GB, and the RL run's 16-token responses 17 GB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

VOCAB = 151_936  # SDAR's (Qwen3's) vocabulary
BOUND_GIB = 4.0
CAP_GIB = 10  # RLIMIT_AS of the child: address space, which runs a few GiB above the resident set

# The child: sample this process's resident memory while `dare train` runs, then report its peak.
_DRIVER = """
import json, resource, sys, threading, time
peak = [0]
done = threading.Event()
def sample():
    while not done.is_set():
        with open("/proc/self/status") as fh:
            kib = next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
        peak[0] = max(peak[0], kib)
        time.sleep(0.005)
cap = int(sys.argv[1]) * 2**30
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
threading.Thread(target=sample, daemon=True).start()
from dare.cli import main
code = main(sys.argv[2:])
done.set()
print("RESULT " + json.dumps({"code": code, "sampled_peak_gib": peak[0] / 2**20}))
"""


def _tokenizer(save_dir: Path) -> object:
    """A word-level tokenizer of exactly `VOCAB` ids: digits and '+=' first, then other characters."""
    from dllm_models.char_tokenizer import char_tokenizer

    chars = "0123456789+= " + "".join(chr(0x20000 + i) for i in range(VOCAB - 13 - 2))
    tok = char_tokenizer(chars, save_dir=save_dir)
    assert len(tok) == VOCAB
    return tok


@pytest.fixture(scope="module")
def tiny_sdar(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from dllm_models import build_model, save_model
    from tests.dllm_models.tiny_configs import tiny_sdar_config

    root = tmp_path_factory.mktemp("sdar-151k")
    tok = _tokenizer(root / "tok")
    ids = {"vocab_size": VOCAB, "mask_token_id": tok.mask_token_id, "eos_token_id": tok.eos_token_id,  # type: ignore[attr-defined]
           "pad_token_id": tok.pad_token_id}  # type: ignore[attr-defined]
    model = build_model(tiny_sdar_config(**ids, hidden_size=64, intermediate_size=128, num_hidden_layers=2))
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.02)  # type: ignore[operator]
    assert 19e6 < sum(p.numel() for p in model.parameters()) < 21e6
    save_model(model, root / "model", tokenizer=tok)
    g = torch.Generator().manual_seed(0)
    digits = lambda n: "".join(str(int(d)) for d in torch.randint(0, 10, (n,), generator=g))  # noqa: E731
    pq.write_table(pa.table({"prompt": [digits(200) for _ in range(4)], "response": [digits(250) for _ in range(4)]}),
                   root / "sft.parquet")
    pairs = [(a, b) for a in range(10, 14) for b in range(10, 14)]
    pq.write_table(pa.table({
        "data_source": ["gsm8k"] * len(pairs),
        "prompt": [[{"role": "user", "content": f"{a}+{b}="}] for a, b in pairs],
        "reward_model": [{"ground_truth": str(a + b)} for a, b in pairs],
        "extra_info": [{"index": i} for i in range(len(pairs))],
    }), root / "rl.parquet")
    return {"model": root / "model", "sft": root / "sft.parquet", "rl": root / "rl.parquet"}


def _train(args: list[str], out: Path) -> tuple[dict[str, float], list[dict[str, float]]]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(CAP_GIB), "train", *args, "checkpoint.dtype=float32",
                           "trainer.num_threads=1", "--output-dir", str(out), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"dare train failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["code"] == 0
    return result, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _peaks(records: list[dict[str, float]], key: str) -> list[float]:
    return [r[k] for r in records for k in r if k.endswith(key)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_lora_sft_of_a_151k_vocabulary_sdar_stays_in_a_few_gb(tiny_sdar: dict[str, Path], tmp_path: Path) -> None:
    result, records = _train(["sdar-lora-sft", f"checkpoint.checkpoint={tiny_sdar['model']}",
                              f"data.train_files={tiny_sdar['sft']}", "data.max_prompt_length=256",
                              "data.max_response_length=256", "sft.steps=1", "sft.batch_size=2",
                              "trainer.max_tokens_per_pass=1024"], tmp_path / "sft")
    assert len(records) == 1 and records[0]["grad_norm"] > 0  # it trained
    peaks = _peaks(records, "peak_rss_gib")
    assert peaks and 0 < max(peaks) <= result["sampled_peak_gib"] * 1.05 + 0.05  # the metric sees the same memory
    assert result["sampled_peak_gib"] < BOUND_GIB


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_bgpo_of_a_151k_vocabulary_sdar_stays_in_a_few_gb(tiny_sdar: dict[str, Path], tmp_path: Path) -> None:
    result, records = _train(["sdar-bgpo", f"checkpoint.checkpoint={tiny_sdar['model']}",
                              f"data.train_files={tiny_sdar['rl']}", "rollout.max_new_tokens=16",
                              "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=1",
                              "trainer.eval_every=0", "trainer.save_every=0"], tmp_path / "rl")
    assert len(records) == 1
    assert {"rollout_peak_rss_gib", "update_peak_rss_gib", "peak_rss_gib"} <= set(records[0])
    assert records[0]["peak_rss_gib"] < BOUND_GIB
    assert result["sampled_peak_gib"] < BOUND_GIB

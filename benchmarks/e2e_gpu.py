"""The user's commands end to end on random-weight, release-layout model folders (issue 12).

For each selected run this script

1. writes the model folder a user would download: the release's config.json and
   generation_config.json, random bf16 safetensors (built on the meta device, `to_empty` on the
   GPU, `reset_parameters(std=0.02)`, saved by `dllm_models.save_model`) and tokenizer files. SDAR
   and Dream get their real tokenizer files; LLaDA and LLaDA2 (whose releases ship only
   tokenizer_config.json / special_tokens_map.json here) get a stand-in byte-level BPE
   `PreTrainedTokenizerFast`: Qwen2's ordinary tokens (from any folder of --checkpoints with
   vocab.json + merges.txt) below the release's first special id, the release's special tokens at
   their ids (tokenizer_config.json `added_tokens_decoder`, config.json eos/pad/mask ids), dummy
   tokens filling the rest, so `len(tokenizer) == vocab_size` and every id stays in the vocabulary,
   and the release's chat template. A folder that already holds weights is reused.
2. writes small GSM8K data files: RL rows in the RL schema (`dare.pipeline.read_rl_rows`) and
   SFT prompt/response rows (`dare.datasets`), from --data (else the dllm_eval shipped `gsm8k`).
3. runs the user's commands as subprocesses, `python apps/dare train <recipe> checkpoint.checkpoint=...
   data.train_files=... trainer.max_steps=N [rl.prompts_per_step=P] --output-dir ... --no-progress`
   and `python apps/dare eval <folder> --benchmarks gsm8k --limit 64`, with PYTHONPATH set to
   every workspace member's src folder (the GPU machine has no uv); --resume reruns each training
   command with one more step into the same folder and checks that the step count continues.
4. prints per run seconds per step (mean of the steps after the first, from the wall-clock arrival
   of each metrics.jsonl line), generated tokens/s (response tokens of a step / rollout_s), peak
   GiB, the split into rollout/old/reference/update, the exit status (a failure shows the last
   lines of its stderr), and for eval runs samples and tokens/s. All rows go to $OUT/e2e_gpu.json
   (or --json).

Only `trainer.max_steps` (`sft.steps`) and `rl.prompts_per_step` are lowered (--steps, --prompts);
every per-sequence setting stays the recipe's. `--tiny` shrinks every config to 2 layers of width
64 (vocabulary, special ids, block length and MoE routing kept), shortens the responses, and runs
on CPU in a temporary folder: the smoke test of tests/integration/test_e2e_gpu.py.

    python3 benchmarks/e2e_gpu.py --runs sdar-bgpo --steps 2 --prompts 8 --resume   # H200
    python3 benchmarks/e2e_gpu.py --runs sdar-bgpo@SDAR-1dot7B-Chat --steps 2        # another folder
    uv run python benchmarks/e2e_gpu.py --tiny --runs sdar-bgpo,llada-d1,eval-sdar    # CPU smoke run
    uv run python benchmarks/e2e_gpu.py --prepare-devshare                            # copy inputs to .devshare/
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC_DIRS = [str(p) for p in sorted(REPO.glob("packages/*/src"))] + [str(REPO / "apps" / "dare" / "src")]
for _src in reversed(SRC_DIRS):  # run with plain python3 on the GPU machine (no uv, no install)
    if _src not in sys.path:
        sys.path.insert(0, _src)

import torch  # noqa: E402

# Files of a release folder the script reads (configs and tokenizers; never weights).
SOURCE_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.json")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One user command: `kind` "rl" / "sft" (dare train `recipe`) or "eval" (dare eval), on `model`."""

    kind: str
    recipe: str
    model: str


RUNS: dict[str, RunSpec] = {
    "sdar-bgpo": RunSpec("rl", "sdar-bgpo", "SDAR-8B-Chat"),
    "dream-d1": RunSpec("rl", "dream-d1", "Dream-v0-Instruct-7B"),
    "llada-d1": RunSpec("rl", "llada-d1", "LLaDA-8B-Instruct"),
    "llada-cj-grpo": RunSpec("rl", "llada-cj-grpo", "LLaDA-8B-Instruct"),
    "llada2-cj-grpo": RunSpec("rl", "llada2-cj-grpo", "LLaDA2.0-mini"),
    "llada-sft": RunSpec("sft", "llada-sft", "LLaDA-8B-Instruct"),
    "sdar-lora-sft": RunSpec("sft", "sdar-lora-sft", "SDAR-8B-Chat"),
    "eval-sdar": RunSpec("eval", "", "SDAR-8B-Chat"),
    "eval-dream": RunSpec("eval", "", "Dream-v0-Instruct-7B"),
}
DEFAULT_RUNS = "sdar-bgpo,dream-d1,llada-d1,llada-cj-grpo,llada-sft,sdar-lora-sft,eval-sdar,eval-dream"


def parse_run(text: str) -> tuple[str, RunSpec]:
    """`name` or `name@ModelFolder` (another release folder of --checkpoints, e.g. SDAR-1dot7B-Chat)."""
    name, _, model = text.partition("@")
    if name not in RUNS:
        raise SystemExit(f"e2e_gpu: unknown run {name!r}; choose from {sorted(RUNS)} (optionally @<model folder>)")
    spec = RUNS[name]
    return (text, dataclasses.replace(spec, model=model) if model else spec)


# ----------------------------------------------------------------------------- model folders


def shrink(raw: dict[str, Any]) -> dict[str, Any]:
    """Toy width/depth of a release config: vocabulary, special ids, block length and MoE routing kept."""
    out = dict(raw)
    if raw["model_type"] == "llada":
        out.update(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=128)
        return out
    out.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128)
    if "head_dim" in raw:
        out["head_dim"] = 16
    if "moe_intermediate_size" in raw:
        out["moe_intermediate_size"] = 32
    if raw.get("rotary_dim") is not None:
        out["rotary_dim"] = int(16 * float(raw.get("partial_rotary_factor", 1.0)))
    if "max_window_layers" in raw:
        out["max_window_layers"] = 2
    return out


def has_weights(folder: Path) -> bool:
    from dllm_models import weight_files

    try:
        weight_files(folder)
    except (OSError, ValueError):
        return False
    return (folder / "config.json").is_file()


def write_weights(raw: dict[str, Any], folder: Path, device: str) -> float:
    """Random bf16 weights of `raw`'s architecture saved into `folder` (replaced); returns seconds."""
    from dllm_models import empty_model, save_model

    t0 = time.perf_counter()
    model = empty_model(raw, dtype=torch.bfloat16, device=device)  # no float32 copy of 8B weights on the way
    model.reset_parameters(generator=torch.Generator(device=device).manual_seed(0), std=0.02)  # type: ignore[operator]
    save_model(model, folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return time.perf_counter() - t0


def _qwen_source(checkpoints: Path) -> Path | None:
    """A folder of --checkpoints with Qwen2's byte-level BPE files (SDAR, Dream)."""
    for d in sorted(checkpoints.iterdir()) if checkpoints.is_dir() else []:
        if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            return d
    return None


def _native_ids(raw: dict[str, Any]) -> dict[str, int]:
    """eos/pad/mask ids as the native model reads them (config.json, else the family's defaults)."""
    from dllm_models import build_model

    with torch.device("meta"):
        cfg = getattr(build_model(raw), "config")
    return {k: int(getattr(cfg, f"{k}_token_id")) for k in ("eos", "pad", "mask")
            if getattr(cfg, f"{k}_token_id", None) is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def standin_tokenizer(src: Path, raw: dict[str, Any], qwen: Path | None) -> Any:
    """A byte-level BPE fast tokenizer with the release's special tokens at the release's ids.

    Ordinary tokens: Qwen2's vocabulary below the lowest special id (merges whose parts all stay),
    or the 256 byte tokens alone without a Qwen2 source; dummy tokens fill every other id, so the
    vocabulary has exactly config.json's `vocab_size` entries.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_size = int(raw["vocab_size"])
    tcfg: dict[str, Any] = {}
    if (src / "tokenizer_config.json").is_file():
        tcfg = json.loads((src / "tokenizer_config.json").read_text())
    smap: dict[str, Any] = {}
    if (src / "special_tokens_map.json").is_file():
        smap = json.loads((src / "special_tokens_map.json").read_text())
    template = tcfg.get("chat_template")
    if template is None and (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text()
    if template is None:
        template = ("{% for m in messages %}<|role_start|>{{ m['role'] }}<|role_sep|>{{ m['content'] }}"
                    "<|role_end|>{% endfor %}{% if add_generation_prompt %}<|role_start|>assistant"
                    "<|role_sep|>{% endif %}")

    special: dict[int, str] = {int(i): str(t["content"]) for i, t in (tcfg.get("added_tokens_decoder") or {}).items()}
    named: dict[str, str] = {}
    for key in ("bos_token", "eos_token", "pad_token", "mask_token", "cls_token", "sep_token", "unk_token",
                "gmask_token"):
        text = _token_text(tcfg.get(key)) or _token_text(smap.get(key))
        if text:
            named[key] = text
    ids = _native_ids(raw)
    if raw.get("bos_token_id") is not None:
        ids["bos"] = int(raw["bos_token_id"])
    placed = set(special.values())
    for key, tid in ids.items():  # the release's ids of eos/pad/mask/bos, with their names where known
        text = named.get(f"{key}_token") or ("<|mask|>" if key == "mask" else f"<|{key}|>")
        if tid in special or text in placed:
            continue
        special[tid] = text
        placed.add(text)
    extra = [t for t in named.values()]
    extra += [t for t in (_token_text(x) for x in tcfg.get("additional_special_tokens") or []) if t]
    extra += re.findall(r"<\|[A-Za-z0-9_]+\|>|</?role>", template)
    nxt = max(special) + 1 if special else vocab_size - 1
    for text in dict.fromkeys(extra):  # tokens without a known id: the next free ids after the known ones
        if text in placed:
            continue
        while nxt in special:
            nxt += 1
        if nxt >= vocab_size:
            raise ValueError(f"no free id below vocab_size={vocab_size} for {text!r}")
        special[nxt] = text
        placed.add(text)
    low = min(special)

    base: dict[str, int] = {}
    merges: list[tuple[str, str]] = []
    if qwen is not None:
        qv: dict[str, int] = json.loads((qwen / "vocab.json").read_text())
        base = {t: i for t, i in qv.items() if i < low and t not in placed}
        for line in (qwen / "merges.txt").read_text(encoding="utf-8").splitlines():
            if not line or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            if a in base and b in base and a + b in base:
                merges.append((a, b))
    else:
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        base = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab = dict(base)
    used = set(base.values())
    for tid, text in special.items():
        vocab[text] = tid
        used.add(tid)
    for tid in range(vocab_size):
        if tid not in used:
            vocab[f"<|dummy_{tid}|>"] = tid
    assert len(vocab) == vocab_size and max(vocab.values()) == vocab_size - 1, "vocabulary is not 0..vocab_size-1"

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(special.items())])
    kwargs = {k: v for k, v in named.items() if k in ("bos_token", "eos_token", "pad_token", "mask_token",
                                                      "cls_token", "sep_token", "unk_token")}
    if "eos_token" not in kwargs and "eos" in ids:
        kwargs["eos_token"] = special[ids["eos"]]
    if "pad_token" not in kwargs and "pad" in ids:
        kwargs["pad_token"] = special[ids["pad"]]
    if "mask_token" not in kwargs and "mask" in ids:
        kwargs["mask_token"] = special[ids["mask"]]
    kw_values = set(kwargs.values())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=int(tcfg.get("model_max_length", 32768)),
                                   additional_special_tokens=[t for _, t in sorted(special.items())
                                                              if t not in kw_values and not t.startswith("<|dummy_")],
                                   **kwargs)
    fast.chat_template = template
    return fast


def check_tokenizer(folder: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The folder's tokenizer, as the product loads it, on a chat prompt: ids inside the vocabulary."""
    from dllm_models import load_tokenizer

    tok = load_tokenizer(folder)
    msgs = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many? ####"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    ids += tok("Some ordinary text: 3 + 4 = 7, émigré, 数学.", add_special_tokens=False)["input_ids"]
    vocab = int(raw["vocab_size"])
    if max(ids) >= vocab or min(ids) < 0:
        raise ValueError(f"{folder}: the tokenizer produced id {max(ids)} outside vocab_size={vocab}")
    native = _native_ids(raw)
    if tok.eos_token_id is not None and "eos" in native and tok.eos_token_id != native["eos"]:
        eos = raw.get("eos_token_id")
        if not (isinstance(eos, list) and tok.eos_token_id in eos):
            print(f"  note: {folder.name} tokenizer eos {tok.eos_token_id} != config eos {native['eos']}")
    return {"tokenizer_len": len(tok), "prompt_tokens": len(ids)}


def prepare_model(name: str, checkpoints: Path, models_dir: Path, *, tiny: bool, device: str) -> dict[str, Any]:
    """`models_dir/name`: release config + random weights + tokenizer (reused when it holds weights)."""
    src = checkpoints / name
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}/config.json not found: copy the release's config and tokenizer files "
                                f"there (python3 benchmarks/e2e_gpu.py --prepare-devshare)")
    raw = json.loads((src / "config.json").read_text())
    raw["torch_dtype"] = "bfloat16"
    raw.pop("dtype", None)
    if tiny:
        raw = shrink(raw)
    folder = models_dir / name
    info: dict[str, Any] = {"model": name, "folder": str(folder)}
    if has_weights(folder):
        info["weights"] = "reused"
    else:
        info["write_weights_s"] = round(write_weights(raw, folder, device), 1)
        info["weights"] = "written"
    (folder / "config.json").write_text(json.dumps(raw, indent=2))  # the release's config, not the native round trip
    if (src / "generation_config.json").is_file():
        shutil.copy2(src / "generation_config.json", folder / "generation_config.json")
    from dllm_models import has_tokenizer
    from dllm_models.checkpoint import copy_tokenizer_files

    if not has_tokenizer(folder):
        if has_tokenizer(src):
            copy_tokenizer_files(src, folder)
            info["tokenizer"] = "release"
        else:
            standin_tokenizer(src, raw, _qwen_source(checkpoints)).save_pretrained(str(folder))
            info["tokenizer"] = "stand-in"
    info.update(check_tokenizer(folder, raw))
    info["size_gib"] = round(sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**30, 2)
    return info


# ----------------------------------------------------------------------------- data


def write_data(data_dir: Path | None, out: Path, rows: int) -> tuple[str, str]:
    """(RL train source, SFT parquet path): subsets of --data's GSM8K files, else dllm_eval's gsm8k."""
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    out.mkdir(parents=True, exist_ok=True)
    rl_src = data_dir / "rl" / "train" / "gsm8k_1.parquet" if data_dir else None
    rl: str = "gsm8k"  # the shipped dllm_eval test set, a valid data.train_files entry
    if rl_src is not None and rl_src.is_file():
        rl_path = out / "gsm8k_rl.parquet"
        pq.write_table(pq.read_table(rl_src).slice(0, rows), rl_path)
        rl = str(rl_path)
    sft_src = data_dir / "sft" / "train" / "gsm8k_train.parquet" if data_dir else None
    prompts: list[str] = []
    responses: list[str] = []
    if sft_src is not None and sft_src.is_file():
        for rec in pq.read_table(sft_src).slice(0, rows).to_pylist():
            prompts.append(str(rec["extra_info"]["question"]))
            responses.append(str(rec["extra_info"]["answer"]))
    else:
        from dllm_eval import load_rows

        for row in load_rows("gsm8k")[:rows]:
            prompts.append(str(row.prompt[-1]["content"]))
            responses.append(f"The answer is {row.ground_truth}.\n#### {row.ground_truth}")
    sft_path = out / "gsm8k_sft.parquet"
    pq.write_table(pa.table({"prompt": prompts, "response": responses}), sft_path)
    return rl, str(sft_path)


# ----------------------------------------------------------------------------- running commands


@dataclasses.dataclass
class Finished:
    rc: int | None
    wall_s: float
    line_times: list[float]  # seconds from start at which each new metrics.jsonl line appeared
    stdout: str
    stderr: str
    timed_out: bool
    peak_rss_gib: float | None = None  # largest sampled host memory of its processes (when max_rss_gib > 0)


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def group_rss_gib(pgid: int) -> float:
    """Resident memory of every process of a process group or session (Linux /proc), GiB.

    The session counts too: Ray puts each worker process (a rank) in a process group of its own,
    inside the session of the command that started the cluster. Each process counts its
    proportional share (PSS, from smaps_rollup), so shared libraries and shared memory that many
    processes map are counted once in all; its RSS where PSS cannot be read.
    """
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if pgid in (int(fields[2]), int(fields[3])):  # fields after the command: state, ppid, pgrp, session
                total += _pss_bytes(stat.parent) or int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return total / 2**30


def _pss_bytes(proc_dir: Path) -> int | None:
    try:
        for line in (proc_dir / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, IndexError, ValueError):
        return None
    return None


def run_command(cmd: list[str], env: dict[str, str], timeout: float, log_dir: Path,
                metrics: Path | None, max_rss_gib: float = 0.0) -> Finished:
    """Run `cmd` in its own session, timing each metrics.jsonl line as it appears; kill it on timeout
    or (max_rss_gib > 0) when its processes hold more host memory than that."""
    log_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(log_dir.glob("stdout*.log")))
    out_path, err_path = log_dir / f"stdout{n}.log", log_dir / f"stderr{n}.log"
    start_lines = _count_lines(metrics) if metrics else 0
    times: list[float] = []
    t0 = time.perf_counter()
    timed_out = False
    peak_rss: float | None = None
    with open(out_path, "w") as out_fh, open(err_path, "w") as err_fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out_fh, stderr=err_fh, start_new_session=True)
        seen = start_lines
        while True:
            rc = proc.poll()
            if metrics is not None:
                now = _count_lines(metrics)
                times += [time.perf_counter() - t0] * max(0, now - seen)
                seen = max(seen, now)
            if rc is not None:
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                _kill(proc)
                break
            rss = group_rss_gib(proc.pid) if max_rss_gib else 0.0
            peak_rss = max(peak_rss or 0.0, rss) if max_rss_gib else None
            if max_rss_gib and rss > max_rss_gib:
                err_fh.write(f"\ne2e_gpu: killed: host memory above --max-rss-gib={max_rss_gib}\n")
                err_fh.flush()
                _kill(proc)
                break
            time.sleep(0.2)
    wall = time.perf_counter() - t0
    return Finished(proc.returncode, wall, times, out_path.read_text(errors="replace"),
                    err_path.read_text(errors="replace"), timed_out, peak_rss)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop the run's process group (the command and what it started), SIGTERM then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def status_of(f: Finished) -> str:
    if f.timed_out:
        return "timeout"
    if f.rc == 0:
        return "ok"
    if "out of GPU memory" in f.stderr or "CUDA out of memory" in f.stderr:
        return "oom"
    if "e2e_gpu: killed: host memory" in f.stderr:
        return "host-oom"
    if f.rc is not None and f.rc < 0:
        return f"killed by signal {-f.rc}"  # SIGKILL: most often the host's out-of-memory killer
    return "failed"


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _after_first(values: list[float]) -> list[float]:
    return values[1:] if len(values) > 1 else values


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- the runs


def train_overrides(spec: RunSpec, args: argparse.Namespace, steps: int) -> list[str]:
    """The user's dotted overrides: step budget, prompts, tiny-only short responses, --set."""
    from dare.recipes import get_recipe

    cfg: Any = get_recipe(spec.recipe)
    words = [f"sft.steps={steps}" if spec.kind == "sft" else f"trainer.max_steps={steps}"]
    if spec.kind == "rl" and args.prompts:
        words.append(f"rl.prompts_per_step={args.prompts}")
    if args.tiny:
        # CPU smoke test only: block families take the packed sdpa path with the fused log-prob head
        # in RL and SFT alike (the padded CPU default materialises [rows, 2 x length, vocab] logits of
        # the BD3LM layout: over 20 GB at vocab 152k, 16 rows; an SFT row of GSM8K alone passed the
        # 8 GiB host cap); RL decodes short responses
        r = cfg.rollout
        if r.block_diffusion:
            words.append("trainer.train_attention=sdpa")
        if spec.kind == "rl":
            words += ([f"rollout.max_new_tokens={2 * r.block_length}"] if r.block_diffusion else
                      ["rollout.max_new_tokens=16", "rollout.steps=8", "rollout.block_length=8"])
    words += list(args.set or [])
    return words


def run_train(key: str, spec: RunSpec, folder: Path, data: tuple[str, str], args: argparse.Namespace,
              env: dict[str, str], work: Path) -> dict[str, Any]:
    from dare.recipes import get_recipe

    out = (args.runs_dir or work / "runs") / key.replace("@", "_")
    if out.exists():
        shutil.rmtree(out)
    train_files = data[0] if spec.kind == "rl" else data[1]
    steps = args.steps
    base = [sys.executable, str(REPO / "apps" / "dare"), "train", spec.recipe,
            f"checkpoint.checkpoint={folder}", f"data.train_files={train_files}"]
    tail_args = ["--output-dir", str(out), "--no-progress"]
    cmd = [*base, *train_overrides(spec, args, steps), *tail_args]
    print(f"\n=== {key}: {' '.join(cmd[1:])}", flush=True)
    f = run_command(cmd, env, args.timeout, work / "logs" / key.replace("@", "_"), out / "metrics.jsonl", args.max_rss_gib)
    recs = read_jsonl(out / "metrics.jsonl")
    cfg = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    recipe: Any = get_recipe(spec.recipe)
    row: dict[str, Any] = {"run": key, "kind": spec.kind, "recipe": spec.recipe, "model": folder.name,
                           "command": " ".join(["python3", *cmd[1:]]), "status": status_of(f), "rc": f.rc,
                           "wall_s": round(f.wall_s, 1), "steps_done": len(recs)}
    gaps = [b - a for a, b in zip(f.line_times, f.line_times[1:])]
    row["first_step_s_incl_startup"] = round(f.line_times[0], 1) if f.line_times else None
    row["step_s"] = _mean(gaps)
    if spec.kind == "rl" and cfg:
        rows_per_step = int(cfg["rl"]["prompts_per_step"]) * int(cfg["rl"]["group_size"])
        used = _after_first(recs)
        row.update(prompts_per_step=cfg["rl"]["prompts_per_step"], group_size=cfg["rl"]["group_size"],
                   rows_per_step=rows_per_step, max_new_tokens=cfg["rollout"]["max_new_tokens"],
                   recipe_prompts_per_step=recipe.rl.prompts_per_step)
        for k in ("rollout_s", "old_s", "reference_s", "update_s", "update_passes", "response_length"):
            row[k] = _mean([float(r[k]) for r in used if k in r])
        row["peak_gib"] = max((float(r["peak_gib"]) for r in recs if "peak_gib" in r), default=None)
        tok_s = [float(r["response_length"]) * rows_per_step / float(r["rollout_s"])
                 for r in used if r.get("rollout_s") and "response_length" in r]
        row["gen_tok_s"] = _mean(tok_s)
        parts = [sum(float(r.get(k, 0.0)) for k in ("rollout_s", "old_s", "reference_s", "update_s")) for r in used]
        row["parts_s"] = _mean(parts)
        step = row["step_s"] if row["step_s"] is not None else row["parts_s"]
        if step is not None:  # linear in prompts: rollout, likelihood and update all scale with the rows
            row["est_full_step_s"] = step * recipe.rl.prompts_per_step / int(cfg["rl"]["prompts_per_step"])
    elif spec.kind == "sft" and cfg:
        row.update(batch_size=cfg["sft"]["batch_size"], loss=_mean([float(r["loss"]) for r in recs if "loss" in r]),
                   grad_norm=_mean([float(r["grad_norm"]) for r in recs if "grad_norm" in r]))
        row["peak_gib"] = max((float(r["peak_gib"]) for r in recs if "peak_gib" in r), default=None)
    if row["status"] != "ok":
        row["stderr_tail"] = tail(f.stderr)
    elif args.resume:
        cmd2 = [*base, *train_overrides(spec, args, steps + 1), *tail_args]
        print(f"=== {key} resume: ... {' '.join(cmd2[-len(tail_args) - 3:-len(tail_args)])}", flush=True)
        g = run_command(cmd2, env, args.timeout, work / "logs" / key.replace("@", "_"), out / "metrics.jsonl", args.max_rss_gib)
        recs2 = read_jsonl(out / "metrics.jsonl")
        new = recs2[len(recs):]
        # resumed: the checkpoint was found ("resuming from" in the log) and exactly the next step ran; the
        # final checkpoint of the resumed run is reported apart (an 8B run's second ~48 GB checkpoint may
        # not fit the disk, which the run reports in one line)
        continued = ("resuming from" in g.stderr + g.stdout and len(recs2) == steps + 1
                     and [r.get("step") for r in new] == [steps + 1])
        row["resume"] = {"status": status_of(g), "rc": g.rc, "wall_s": round(g.wall_s, 1),
                         "steps_after": len(recs2), "new_steps": [r.get("step") for r in new], "continued": continued,
                         "finished": f"finished {steps + 1} steps" in g.stdout}
        if g.rc != 0 or not continued:
            row["resume"]["stderr_tail"] = tail(g.stderr)
    if not args.keep_outputs:  # 8B checkpoints (weights + optimizer state) and model/ exports fill the disk
        for sub in ("checkpoints", "model"):
            shutil.rmtree(out / sub, ignore_errors=True)
    return row


_EVAL_LINE = re.compile(r"(\S+): (\d+) samples in ([0-9.]+) s")


def run_eval(key: str, spec: RunSpec, folder: Path, args: argparse.Namespace, env: dict[str, str],
             work: Path) -> dict[str, Any]:
    out = work / "runs" / key.replace("@", "_")
    if out.exists():
        shutil.rmtree(out)
    limit = args.eval_limit
    cmd = [sys.executable, str(REPO / "apps" / "dare"), "eval", str(folder), "--benchmarks", "gsm8k",
           "--limit", str(limit), "--output-dir", str(out)]
    if args.tiny:
        cmd += ["--max-new-tokens", "16", "--steps", "16", "--block-length", "4"]
    cmd += list(args.eval_args or [])
    print(f"\n=== {key}: {' '.join(cmd[1:])}", flush=True)
    f = run_command(cmd, env, args.timeout, work / "logs" / key.replace("@", "_"), None, args.max_rss_gib)
    row: dict[str, Any] = {"run": key, "kind": "eval", "model": folder.name,
                           "command": " ".join(["python3", *cmd[1:]]), "status": status_of(f), "rc": f.rc,
                           "wall_s": round(f.wall_s, 1)}
    samples = read_jsonl(out / "gsm8k" / "samples.jsonl")
    manifest = json.loads((out / "gsm8k" / "manifest.json").read_text()) if (out / "gsm8k" / "manifest.json").is_file() else {}
    decoding = manifest.get("decoding") or {}
    row.update(samples=len(samples), max_new_tokens=decoding.get("max_new_tokens"), decoding=decoding,
               accuracy=_mean([float(s["acc"]) for s in samples]) if samples else None)
    m = _EVAL_LINE.findall(f.stderr)
    gen_s = float(m[-1][2]) if m else None
    row["generate_score_s"] = gen_s
    tokens = manifest.get("generated_tokens")  # if the manifest counts them; else every decoded position
    if tokens is None and samples and decoding.get("max_new_tokens"):
        tokens = len(samples) * int(decoding["max_new_tokens"])
    row["generated_tokens"] = tokens
    seconds = manifest.get("generate_s") or gen_s
    row["tok_s"] = tokens / seconds if tokens and seconds else None
    if row["status"] != "ok":
        row["stderr_tail"] = tail(f.stderr)
    return row


# ----------------------------------------------------------------------------- output


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n" + "=" * 100)
    head = (f"{'run':28s} {'status':8s} {'steps':>5s} {'s/step':>8s} {'est.full':>8s} {'gen tok/s':>10s} "
            f"{'peak GiB':>8s} {'rollout':>8s} {'old':>7s} {'ref':>7s} {'update':>7s} {'resume':>8s}")
    print(head)
    for r in rows:
        if r["kind"] == "eval":
            print(f"{r['run']:28s} {r['status']:8s} samples={_fmt(r.get('samples'))} "
                  f"new_tokens={_fmt(r.get('max_new_tokens'))} generate+score={_fmt(r.get('generate_score_s'))} s "
                  f"tok/s={_fmt(r.get('tok_s'))} acc={_fmt(r.get('accuracy'), 3)} wall={_fmt(r.get('wall_s'))} s")
        else:
            res = r.get("resume")
            rtxt = "-" if res is None else ("ok" if res.get("continued") else res.get("status", "?"))
            print(f"{r['run']:28s} {r['status']:8s} {_fmt(r.get('steps_done')):>5s} {_fmt(r.get('step_s'), 2):>8s} "
                  f"{_fmt(r.get('est_full_step_s'), 1):>8s} {_fmt(r.get('gen_tok_s')):>10s} "
                  f"{_fmt(r.get('peak_gib'), 2):>8s} {_fmt(r.get('rollout_s'), 2):>8s} {_fmt(r.get('old_s'), 2):>7s} "
                  f"{_fmt(r.get('reference_s'), 2):>7s} {_fmt(r.get('update_s'), 2):>7s} {rtxt:>8s}")
        if r.get("stderr_tail"):
            print("   stderr (last lines):\n      " + r["stderr_tail"].replace("\n", "\n      "))
        if r.get("resume", {}).get("stderr_tail"):
            print("   resume stderr (last lines):\n      " + r["resume"]["stderr_tail"].replace("\n", "\n      "))
    print("s/step: mean wall seconds of the steps after the first; est.full: s/step x recipe prompts / prompts run;"
          " gen tok/s: response tokens of a step / rollout_s")


# ----------------------------------------------------------------------------- main


def _default_dir(kind: str) -> Path:
    shared = REPO.parent / "shared" / kind
    return shared if shared.is_dir() else REPO / ".devshare" / kind


def prepare_devshare(checkpoints: Path, data: Path, target: Path, models: Sequence[str]) -> None:
    """Copy the small files the GPU machine needs (configs, tokenizers, GSM8K parquet) under `target`."""
    for name in models:
        dst = target / "checkpoints" / name
        dst.mkdir(parents=True, exist_ok=True)
        for fname in SOURCE_FILES:
            if (checkpoints / name / fname).is_file():
                shutil.copy2(checkpoints / name / fname, dst / fname)
    for rel in ("rl/train/gsm8k_1.parquet", "sft/train/gsm8k_train.parquet"):
        if (data / rel).is_file():
            (target / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(data / rel, target / "data" / rel)
    total = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(f"copied into {target}: {total / 2**20:.1f} MiB")


def command_env(*, tiny: bool) -> dict[str, str]:
    """The commands' environment: every workspace member's src on PYTHONPATH; no GPU when tiny."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*SRC_DIRS, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if tiny:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the smoke test stays on the CPU
    return env


def add_machine_options(ap: argparse.ArgumentParser, *, name: str, tiny_rss_gib: float) -> None:
    """The options of every script that runs the user's commands on written model folders (this one,
    scale_out.py): time limit, input folders, work folder, what to keep, host-memory cap, output."""
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per command")
    ap.add_argument("--checkpoints", type=Path, default=None, help="release config/tokenizer folders "
                    "(default ../shared/checkpoints, else .devshare/checkpoints)")
    ap.add_argument("--data", type=Path, default=None, help="GSM8K data (default ../shared/data, else .devshare/data)")
    ap.add_argument("--workdir", type=Path, default=None, help=f"model folders, data, runs (default .bench/{name}; "
                    "tiny: a temporary folder)")
    ap.add_argument("--data-rows", type=int, default=512)
    ap.add_argument("--keep-outputs", action="store_true", help="keep each run's checkpoints/ and model/")
    ap.add_argument("--keep-models", action="store_true", help="keep model folders after their last run")
    ap.add_argument("--max-rss-gib", type=float, default=None, help="kill a command whose processes hold more "
                    f"host memory, and report their peak (default: {tiny_rss_gib:g} with --tiny, to spare a shared "
                    "CPU machine; else no limit)")
    ap.add_argument("--json", type=Path, default=None, help=f"rows as JSON (default $OUT/{name}.json when $OUT is set)")
    ap.add_argument("--prepare-devshare", type=Path, nargs="?", const=REPO / ".devshare", default=None,
                    help="copy the config/tokenizer/data files the runs need into DIR (default .devshare) and exit")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma-separated, of {sorted(RUNS)}; name@ModelFolder "
                                                         "uses another release folder")
    ap.add_argument("--steps", type=int, default=None, help="trainer.max_steps / sft.steps (default 3; tiny 2)")
    ap.add_argument("--prompts", type=int, default=None, help="rl.prompts_per_step (default: the recipe's; tiny 2)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="dotted overrides for every train run")
    ap.add_argument("--eval-limit", type=int, default=None, help="GSM8K prompts of eval runs (default 64; tiny 4)")
    ap.add_argument("--eval-args", nargs="*", default=[], metavar="ARG", help="extra `dare eval` arguments")
    ap.add_argument("--resume", action="store_true", help="rerun each train command with one more step")
    ap.add_argument("--runs-dir", type=Path, default=None, help="run output folders (default WORKDIR/runs): "
                    "on a machine with a small disk, model folders in /dev/shm and runs (checkpoints) on disk")
    ap.add_argument("--tiny", action="store_true", help="toy shapes on CPU in a temporary folder")
    add_machine_options(ap, name="e2e_gpu", tiny_rss_gib=8)
    args = ap.parse_args(argv)

    checkpoints = args.checkpoints or _default_dir("checkpoints")
    data_dir = args.data or _default_dir("data")
    runs = [parse_run(x.strip()) for x in args.runs.split(",") if x.strip()]
    if args.prepare_devshare is not None:
        models = sorted({s.model for _, s in runs} | {"SDAR-1dot7B-Chat", "LLaDA2.0-mini"})
        prepare_devshare(checkpoints, data_dir, args.prepare_devshare, models)
        return 0
    args.steps = args.steps or (2 if args.tiny else 3)
    args.prompts = args.prompts or (2 if args.tiny else None)
    args.eval_limit = args.eval_limit or (4 if args.tiny else 64)
    if args.max_rss_gib is None:
        args.max_rss_gib = 8.0 if args.tiny else 0.0
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    work = args.workdir or (Path(tempfile.mkdtemp(prefix="e2e_gpu-")) if args.tiny else REPO / ".bench" / "e2e_gpu")
    work.mkdir(parents=True, exist_ok=True)
    env = command_env(tiny=args.tiny)
    print(f"device={device} tiny={args.tiny} checkpoints={checkpoints} data={data_dir} workdir={work}", flush=True)

    t0 = time.perf_counter()
    data = write_data(data_dir if data_dir.is_dir() else None, work / "data", args.data_rows)
    print(f"data: rl={data[0]} sft={data[1]}", flush=True)
    models_dir = work / "models"
    last_use = {s.model: i for i, (_, s) in enumerate(runs)}
    model_info: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for i, (key, spec) in enumerate(runs):
        try:
            if spec.model not in model_info:
                print(f"\n--- model folder {spec.model}", flush=True)
                model_info[spec.model] = prepare_model(spec.model, checkpoints, models_dir, tiny=args.tiny,
                                                       device=device)
                print(f"    {model_info[spec.model]}", flush=True)
            folder = models_dir / spec.model
            if spec.kind == "eval":
                row = run_eval(key, spec, folder, args, env, work)
            else:
                row = run_train(key, spec, folder, data, args, env, work)
        except Exception as err:  # a broken run is a row, not the end of the script
            import traceback

            row = {"run": key, "kind": spec.kind, "model": spec.model, "status": "error",
                   "stderr_tail": tail(traceback.format_exc()), "error": repr(err)}
        rows.append(row)
        print(f"--- {key}: {row['status']} ({_fmt(row.get('wall_s'))} s)", flush=True)
        print("ROW " + json.dumps(row, default=str), flush=True)  # a run cut off later keeps the rows so far
        if last_use[spec.model] == i and not args.keep_models and not args.tiny:
            shutil.rmtree(models_dir / spec.model, ignore_errors=True)  # 16-32 GB each; the disk holds few
    print_table(rows)
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "tiny": args.tiny,
              "steps": args.steps, "prompts": args.prompts, "set": args.set, "models": model_info, "rows": rows,
              "total_s": round(time.perf_counter() - t0, 1)}
    target = args.json or (Path(os.environ["OUT"]) / "e2e_gpu.json" if os.environ.get("OUT") else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=2, default=str))
        print(f"rows written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

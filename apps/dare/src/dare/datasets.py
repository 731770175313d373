"""Offline training data: SFT and preference parquet files, tokenised and batched per step.

Schemas (one example per row):

- SFT: `prompt` (a string, or a list of {"role", "content"} chat messages) and `response` (a
  string). verl's SFT layout, as in the shipped `gsm8k_train.parquet`, is read too: prompt from
  `extra_info.question`, response from `extra_info.answer` (docs/data.md#sft-parquet).
- Preference: `prompt` as above, `chosen` and `rejected` (strings): the preferred and the
  dispreferred response to the same prompt.

Prompts go through the checkpoint's chat template with the generation prompt, as RL prompts do;
responses are tokenised without special tokens. SFT responses end with EOS and a batch is
right-padded with the pad token, attention 1 and inside the loss (the LLaDA SFT convention: the
model learns to end with EOS padding; the reference pads to a fixed 4096, here to the longest
row of the batch). Preference responses get no EOS, padding is outside attention and the ELBO,
and over-long prompts and responses keep their last tokens (docs/algorithms.md#vrpo).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]
import torch

from dllm_train import PreferenceBatch, derive_seed

logger = logging.getLogger(__name__)

SFT_COLUMNS = ("prompt", "response")
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
_VERL_SFT = ("question", "answer")  # fields of verl's `extra_info` struct


@dataclass(frozen=True)
class SFTRow:
    """One SFT example as text: chat messages of the prompt and the response."""

    prompt: list[dict[str, str]]
    response: str


@dataclass(frozen=True)
class PreferenceRow:
    """One preference example as text: the prompt and the chosen and rejected responses."""

    prompt: list[dict[str, str]]
    chosen: str
    rejected: str


@dataclass(frozen=True)
class SFTExample:
    """Token ids of one SFT example; `response_ids` ends with EOS."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


@dataclass(frozen=True)
class PreferenceExample:
    """Token ids of one preference example."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


def _files(train_files: str) -> list[Path]:
    paths = [Path(s.strip()) for s in train_files.split(",") if s.strip()]
    if not paths:
        raise ValueError("data.train_files is empty: pass data.train_files=/path/to/data.parquet[,...]")
    for p in paths:
        if not p.is_file():
            raise ValueError(f"data.train_files entry {str(p)!r} is not a file; pass parquet paths, comma-separated")
    return paths


def _prompt(value: Any, where: str) -> list[dict[str, str]]:
    """A prompt cell as chat messages: a string becomes one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"{where}: prompt must be a string or a non-empty list of {{'role', 'content'}} "
                     f"messages, got {type(value).__name__} {str(value)[:80]!r}")


def _text(value: Any, column: str, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: column {column!r} must hold strings, got {type(value).__name__} "
                         f"{str(value)[:80]!r}; write it as text")
    return value


def _missing(path: Path, names: Sequence[str], needed: Sequence[str], kind: str, extra: str = "") -> None:
    missing = [c for c in needed if c not in names]
    if missing:
        raise ValueError(
            f"{path}: {kind} data needs columns {list(needed)}{extra}; missing {missing} "
            f"(the file has {list(names)}). Rename or add the columns (e.g. pandas "
            f"df.rename(columns={{'old': {missing[0]!r}}})) and write the parquet again"
        )


def _verl_sft_rows(path: Path, schema: Any) -> list[SFTRow]:
    """Rows of verl's SFT layout: prompt `extra_info.question`, response `extra_info.answer`."""
    info = schema.field("extra_info").type
    fields = [info.field(i).name for i in range(info.num_fields)] if pa.types.is_struct(info) else []
    _missing(path, [f"extra_info.{f}" for f in fields], [f"extra_info.{f}" for f in _VERL_SFT], "SFT",
             " (verl layout; or flat columns 'prompt' and 'response')")
    rows = []
    for i, rec in enumerate(pq.read_table(path, columns=["extra_info"]).to_pylist()):
        where, cell = f"{path} row {i}", rec["extra_info"] or {}
        rows.append(SFTRow(_prompt(_text(cell.get("question"), "extra_info.question", where), where),
                           _text(cell.get("answer"), "extra_info.answer", where)))
    return rows


def read_sft_rows(train_files: str) -> list[SFTRow]:
    """SFT rows of comma-separated parquet paths (schema in the module docstring).

    Raises:
        ValueError: a path is not a file, a column is missing (named, with the fix) or a cell
            has the wrong type (row named).
    """
    rows: list[SFTRow] = []
    for path in _files(train_files):
        schema = pq.read_schema(path)
        if "response" not in schema.names and "extra_info" in schema.names:
            rows += _verl_sft_rows(path, schema)
            continue
        _missing(path, schema.names, SFT_COLUMNS, "SFT", " (prompt: text or chat messages, response: text)")
        for i, rec in enumerate(pq.read_table(path, columns=list(SFT_COLUMNS)).to_pylist()):
            where = f"{path} row {i}"
            rows.append(SFTRow(_prompt(rec["prompt"], where), _text(rec["response"], "response", where)))
    return rows


def read_preference_rows(train_files: str) -> list[PreferenceRow]:
    """Preference rows of comma-separated parquet paths (columns `prompt`, `chosen`, `rejected`).

    Raises:
        ValueError: as `read_sft_rows`.
    """
    rows: list[PreferenceRow] = []
    for path in _files(train_files):
        _missing(path, pq.read_schema(path).names, PREFERENCE_COLUMNS, "preference",
                 " (prompt: text or chat messages, chosen and rejected: text)")
        for i, rec in enumerate(pq.read_table(path, columns=list(PREFERENCE_COLUMNS)).to_pylist()):
            where = f"{path} row {i}"
            rows.append(PreferenceRow(_prompt(rec["prompt"], where), _text(rec["chosen"], "chosen", where),
                                      _text(rec["rejected"], "rejected", where)))
    return rows


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, with the generation prompt."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the checkpoint's tokenizer has no chat template; add `chat_template` to its "
                         "tokenizer_config.json (or a chat_template.jinja file) in checkpoint.checkpoint")
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _text_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_sft(rows: Sequence[SFTRow], tokenizer: Any, *, max_prompt_length: int,
               max_response_length: int) -> list[SFTExample]:
    """Token ids of SFT rows (response + EOS); rows over either length limit are dropped."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the checkpoint's tokenizer has no eos_token; set eos_token in its tokenizer_config.json")
    kept = []
    for row in rows:
        prompt, response = chat_prompt_ids(tokenizer, row.prompt), [*_text_ids(tokenizer, row.response), int(eos)]
        if len(prompt) <= max_prompt_length and len(response) <= max_response_length:
            kept.append(SFTExample(tuple(prompt), tuple(response)))
    if not kept:
        raise ValueError(f"no SFT row fits data.max_prompt_length={max_prompt_length} and "
                         f"data.max_response_length={max_response_length} (response + EOS); raise them")
    if len(kept) < len(rows):
        logger.info("dropped %d of %d SFT rows over the length limits", len(rows) - len(kept), len(rows))
    return kept


def encode_preference(rows: Sequence[PreferenceRow], tokenizer: Any, *, max_prompt_length: int,
                      max_response_length: int) -> list[PreferenceExample]:
    """Token ids of preference rows; prompts and responses keep their last tokens (left truncation)."""
    out = []
    for row in rows:
        prompt = chat_prompt_ids(tokenizer, row.prompt)[-max_prompt_length:]
        chosen = _text_ids(tokenizer, row.chosen)[-max_response_length:]
        rejected = _text_ids(tokenizer, row.rejected)[-max_response_length:]
        if not chosen or not rejected:
            raise ValueError(f"a preference row has an empty chosen or rejected response (prompt "
                             f"{row.prompt[-1]['content'][:60]!r}); drop the row from the parquet")
        out.append(PreferenceExample(tuple(prompt), tuple(chosen), tuple(rejected)))
    return out


@functools.lru_cache(maxsize=4)
def _order(n: int, seed: int, purpose: str, epoch: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(derive_seed(seed, purpose, "epoch", epoch))
    return tuple(torch.randperm(n, generator=g).tolist())


def step_indices(n: int, count: int, step: int, *, seed: int, purpose: str) -> list[int]:
    """Example indices of step `step`: consecutive slices of a seeded permutation per epoch.

    A function of (n, count, step, seed) only, so a resumed run draws what an uninterrupted run
    would; every example is seen once per epoch of n examples.
    """
    return [_order(n, seed, purpose, pos // n)[pos % n] for pos in range(step * count, (step + 1) * count)]


def sft_batch(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, response_valid), each [B, S]: right-padded with `pad_id`.

    Padding keeps attention and counts as response (trained to stay EOS/pad), see the module doc.
    """
    width = max(len(e.prompt_ids) + len(e.response_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    response = torch.zeros(len(examples), width, dtype=torch.bool)
    for b, e in enumerate(examples):
        seq = e.prompt_ids + e.response_ids
        ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        response[b, len(e.prompt_ids):] = True
    return ids, torch.ones_like(response), response


def _side(prompts: Sequence[tuple[int, ...]], responses: Sequence[tuple[int, ...]],
          pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [B, S] ids, attention (real tokens) and response positions of one side."""
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(prompts), width, dtype=torch.bool)
    response = torch.zeros_like(attn)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attn[b, :len(p) + len(r)] = True
        response[b, len(p):len(p) + len(r)] = True
    return ids, attn, response


def preference_batch(examples: Sequence[PreferenceExample], pad_id: int) -> PreferenceBatch:
    """Chosen and rejected sequences ([B, S_c], [B, S_r]) of the examples, padding outside attention."""
    prompts = [e.prompt_ids for e in examples]
    chosen = _side(prompts, [e.chosen_ids for e in examples], pad_id)
    rejected = _side(prompts, [e.rejected_ids for e in examples], pad_id)
    return PreferenceBatch(*chosen, *rejected)

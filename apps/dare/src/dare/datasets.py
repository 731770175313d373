"""Offline training data: SFT and preference parquet files, tokenised and batched per step.

Schemas (one example per row):

- SFT: `prompt` (chat messages: a list of {"role", "content"}, or that list as JSON text; any
  other string is taken as one user message) and `response` (a string). verl's SFT layout, as in the shipped `gsm8k_train.parquet`, is read too: prompt from
  `extra_info.question`, response from `extra_info.answer` (docs/data.md#sft-parquet).
- Preference: `prompt` as above, `chosen` and `rejected` (strings): the preferred and the
  dispreferred response to the same prompt.

Prompts go through the checkpoint's chat template with the generation prompt, as RL prompts do;
responses are tokenised without special tokens. SFT responses end with EOS and a batch is
right-padded with the pad token, attention 1 and inside the loss (the LLaDA SFT convention: the
model learns to end with EOS padding; the reference pads to a fixed 4096, here to the longest
row of the batch). Preference responses get no EOS, padding is outside attention and the ELBO,
and over-long prompts and responses keep their last tokens (docs/algorithms.md#vrpo).

Every cell is checked when the rows are read, before any model is loaded: a null or empty
prompt, response, chosen or rejected cell raises one `ValueError` naming the file, the row
(counted from 0) and the column. Rows whose prompt plus response exceed the positions the
checkpoint was built for are dropped, with the count logged.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]
import torch

from dare.inputs import train_file_entries
from dllm_algorithms import PreferenceBatch
from dllm_train import derive_seed

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
    """The parquet paths of `data.train_files` (each checked: a file, parquet, with rows)."""
    return [Path(e) for e in train_file_entries(train_files)]


def _null(where: str, column: str, what: str) -> ValueError:
    return ValueError(f"{where}, column {column!r}: is null (an empty cell); every row needs {what}: fill it "
                      "or drop the row, and write the parquet again")


def _json_messages(text: str) -> Any:
    """The JSON value of `text` when it is a JSON list (chat messages written as text), else None."""
    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) else None


def cell_prompt(value: Any, where: str, column: str = "prompt") -> list[dict[str, str]]:
    """A prompt cell as chat messages.

    Chat messages (a list of {"role", "content"}, or that list written as JSON text) are taken as
    they are; any other string becomes one user message.

    Args:
        value: the cell.
        where: "<file> row <i>", for the message.
        column: the cell's column, for the message.

    Raises:
        ValueError: naming the file, row and column: a null cell, no messages, a message without
            string `role` and `content`, or no text at all.
    """
    if value is None:
        raise _null(where, column, "a prompt")
    if isinstance(value, str):
        parsed = _json_messages(value)
        value = parsed if parsed is not None else [{"role": "user", "content": value}]
    if not isinstance(value, (list, tuple)) or not value:
        shown = f"{type(value).__name__} {str(value)[:80]!r}"
        raise ValueError(f"{where}, column {column!r}: must be text or a non-empty list of {{'role', 'content'}} "
                         f"chat messages, got {shown}; write the prompt as text or as chat messages")
    for k, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}, column {column!r}: message {k} must be {{'role': str, 'content': str}}, got "
                             f"{str(m)[:80]!r}; write every message with a role and a text content")
    if not any(m["content"].strip() for m in value):
        raise ValueError(f"{where}, column {column!r}: is empty (no message has any text); fill it or drop the row")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def cell_text(value: Any, column: str, where: str, what: str = "a response") -> str:
    """A text cell; raise naming the file, row and column if it is null, not text, or empty."""
    if value is None:
        raise _null(where, column, what)
    if not isinstance(value, str):
        raise ValueError(f"{where}, column {column!r}: must hold text, got {type(value).__name__} "
                         f"{str(value)[:80]!r}; write it as text")
    if not value.strip():
        raise ValueError(f"{where}, column {column!r}: is empty; every row needs {what}: fill it or drop the row")
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
        rows.append(SFTRow(cell_prompt(cell_text(cell.get("question"), "extra_info.question", where, "a question"),
                                       where, "extra_info.question"),
                           cell_text(cell.get("answer"), "extra_info.answer", where)))
    return rows


def read_sft_rows(train_files: str) -> list[SFTRow]:
    """SFT rows of comma-separated parquet paths (schema in the module docstring).

    Raises:
        ValueError: a path is not a parquet file with rows (a folder, another format, no rows), a
            column is missing (named, with the fix), or a cell is null, empty or of the wrong
            type (file, row and column named).
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
            rows.append(SFTRow(cell_prompt(rec["prompt"], where), cell_text(rec["response"], "response", where)))
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
            rows.append(PreferenceRow(cell_prompt(rec["prompt"], where), cell_text(rec["chosen"], "chosen", where),
                                      cell_text(rec["rejected"], "rejected", where)))
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


def check_kept(kind: str, total: int, dropped: dict[str, int], fix: str) -> None:
    """Log how many of `total` rows were dropped and why; raise if none is left.

    Args:
        kind: what the rows are ("SFT rows", "prompts", ...).
        total: rows before filtering.
        dropped: reason (naming the field) -> rows dropped for it.
        fix: what to change when none is left.
    """
    reasons = {reason: n for reason, n in dropped.items() if n}
    lost = sum(reasons.values())
    listed = "; ".join(f"{n} {reason}" for reason, n in reasons.items())
    if lost >= total:
        raise ValueError(f"none of the {total} {kind} can be used ({listed}); {fix}")
    if lost:
        logger.warning("dropped %d of %d %s (%s)", lost, total, kind, listed)


def _over_positions(positions: int | None, what: str) -> str:
    return f"whose {what} exceed the checkpoint's {positions} positions (config.json)"


def encode_sft(rows: Sequence[SFTRow], tokenizer: Any, *, max_prompt_length: int,
               max_response_length: int, positions: int | None = None) -> list[SFTExample]:
    """Token ids of SFT rows (response + EOS); rows over a length limit are dropped, counted in the log.

    Args:
        rows: the rows (`read_sft_rows`).
        tokenizer: the checkpoint's.
        max_prompt_length, max_response_length: `data.*` limits in tokens (response + EOS).
        positions: the checkpoint's positions (`inputs.config_positions`); prompt + response
            longer than that are dropped too. None: no such limit.

    Raises:
        ValueError: no row is left (the counts per reason named).
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the checkpoint's tokenizer has no eos_token; set eos_token in its tokenizer_config.json")
    kept, over_limits, over_positions = [], 0, 0
    for row in rows:
        prompt, response = chat_prompt_ids(tokenizer, row.prompt), [*_text_ids(tokenizer, row.response), int(eos)]
        if len(prompt) > max_prompt_length or len(response) > max_response_length:
            over_limits += 1
        elif positions is not None and len(prompt) + len(response) > positions:
            over_positions += 1
        else:
            kept.append(SFTExample(tuple(prompt), tuple(response)))
    check_kept("SFT rows", len(rows), {
        f"over data.max_prompt_length={max_prompt_length} or data.max_response_length={max_response_length} "
        "(response + EOS)": over_limits,
        _over_positions(positions, "prompt + response"): over_positions},
        "raise the data.* limits named (within the checkpoint's positions), or pass shorter examples")
    return kept


def encode_preference(rows: Sequence[PreferenceRow], tokenizer: Any, *, max_prompt_length: int,
                      max_response_length: int, positions: int | None = None) -> list[PreferenceExample]:
    """Token ids of preference rows; prompts and responses keep their last tokens (left truncation).

    Rows whose truncated prompt plus longer response still exceed `positions` (the checkpoint's;
    None: no limit) are dropped, counted in the log.

    Raises:
        ValueError: a response has no tokens, or no row is left.
    """
    out, over_positions = [], 0
    for row in rows:
        prompt = chat_prompt_ids(tokenizer, row.prompt)[-max_prompt_length:]
        chosen = _text_ids(tokenizer, row.chosen)[-max_response_length:]
        rejected = _text_ids(tokenizer, row.rejected)[-max_response_length:]
        if not chosen or not rejected:
            raise ValueError(f"a preference row has a chosen or rejected response with no tokens (prompt "
                             f"{row.prompt[-1]['content'][:60]!r}); drop the row from the parquet")
        if positions is not None and len(prompt) + max(len(chosen), len(rejected)) > positions:
            over_positions += 1
            continue
        out.append(PreferenceExample(tuple(prompt), tuple(chosen), tuple(rejected)))
    check_kept("preference rows", len(rows), {
        _over_positions(positions, "prompt + response (after data.max_*_length truncation)"): over_positions},
        "lower data.max_prompt_length or data.max_response_length (rows keep their last tokens)")
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

"""RL training data: prompts and verifiers from `data.train_files`, checked before any model loads.

An entry of `data.train_files` is the name of a test set shipped with dllm_eval, or a parquet
file in the RL schema (docs/data.md#rl-parquet):

- `prompt`: chat messages (a list of {"role", "content"}, or that list written as JSON text);
  any other string is taken as one user message (as for SFT and preference data);
- `data_source`: the verifier that scores the row, one of `dllm_eval.REWARDS` (or `sudoku*`);
- the answer, as `ground_truth` or `reward_model.ground_truth` (text; integers are read as text);
- `extra_info` (optional): a struct or JSON object the verifier may read.

`read_rl_rows` reads and checks every cell, so a null prompt or answer, an empty one, or a
`data_source` no verifier scores fails in one line naming the file, the row (counted from 0) and
the column. `encode_prompts` drops prompts over `data.max_prompt_length`, or too long for the
checkpoint's positions with the response, and logs the counts.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

from dare.config import RLRecipeConfig
from dare.datasets import cell_prompt, cell_text, chat_prompt_ids, check_kept
from dare.config_tree import did_you_mean
from dare.inputs import check_rl_columns, config_positions, train_file_entries
from dllm_eval import DATASETS, REWARDS, Row, ground_truth_problem, load_rows
from dllm_models import read_config


def known_data_source(name: str) -> bool:
    """Whether a verifier scores `data_source` `name` (the default reward table, as `score` routes)."""
    return name in REWARDS or name.startswith("sudoku")


def _answer(rec: dict[str, Any], where: str) -> str:
    column = "ground_truth" if "ground_truth" in rec else "reward_model.ground_truth"
    if column == "reward_model.ground_truth":
        rm = rec["reward_model"]
        if rm is None:
            raise ValueError(f"{where}, column 'reward_model': is null (an empty cell); every RL row needs "
                             "reward_model.ground_truth, the answer the verifier compares with: fill it or drop the row")
        value = rm.get("ground_truth")
    else:
        value = rec["ground_truth"]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return cell_text(value, column, where, "an answer (the text the verifier compares with)")


def _extra(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}, column 'extra_info': is not a JSON object ({err}); write it as a struct "
                             "or JSON object text, or leave it null") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}, column 'extra_info': must be a struct or JSON object, got "
                         f"{type(value).__name__}; write it as one, or leave it null")
    return dict(value)


def _source(value: Any, where: str) -> str:
    return cell_text(value, "data_source", where, f"a data_source (one of {sorted(REWARDS)})")


def _check_sources(path: Path, sources: list[str]) -> None:
    """Raise naming the first row of each data_source no verifier scores, with the known ones."""
    unknown = Counter(s for s in sources if not known_data_source(s))
    if not unknown:
        return
    name, count = unknown.most_common(1)[0]
    first = sources.index(name)
    others = f" (and {len(unknown) - 1} other unknown value(s): {sorted(unknown)[:3]})" if len(unknown) > 1 else ""
    raise ValueError(
        f"{path} row {first}, column 'data_source': {name!r} ({count} row(s)) is scored by no verifier{others}"
        f"{did_you_mean(name, REWARDS)}; known data sources: {sorted(REWARDS)} (and sudoku*). Set data_source to "
        "the verifier of each row, or register one in dllm_eval.REWARDS")


def read_rl_file(path: str | Path) -> list[Row]:
    """The rows of one RL parquet file, every cell checked (schema in the module docstring).

    Raises:
        ValueError: the file is no parquet file with rows, lacks a column, or a cell is null,
            empty, of the wrong type or an unknown data_source (file, row and column named).
    """
    check_rl_columns(path)
    rows = []
    for i, rec in enumerate(pq.read_table(path).to_pylist()):
        where = f"{path} row {i}"
        rows.append(Row(index=i, data_source=_source(rec["data_source"], where), prompt=tuple(
            cell_prompt(rec["prompt"], where)), ground_truth=_answer(rec, where),
            extra_info=_extra(rec.get("extra_info"), where)))
    _check_sources(Path(path), [r.data_source for r in rows])
    column = "ground_truth" if "ground_truth" in pq.read_schema(path).names else "reward_model.ground_truth"
    for row in rows:
        _check_ground_truth(row, f"{path} row {row.index}", column)
    return rows


def _check_ground_truth(row: Row, where: str, column: str) -> None:
    """Raise if the row's verifier cannot read its ground truth (`dllm_eval.ground_truth_problem`)."""
    problem = ground_truth_problem(row.data_source, row.ground_truth, row.extra_info)
    if problem is not None:
        raise ValueError(f"{where}, column {column!r} (data_source {row.data_source!r}): {row.ground_truth[:60]!r} "
                         f"{problem}. Fix the row or drop it")


def read_rl_rows(train_files: str) -> list[Row]:
    """Rows of every `data.train_files` entry: a shipped dllm_eval test set name, or an RL parquet file."""
    rows: list[Row] = []
    for entry in train_file_entries(train_files, names=DATASETS):
        rows += load_rows(entry) if entry in DATASETS else read_rl_file(entry)
    return rows


def encode_prompts(rows: list[Row], tokenizer: Any, max_prompt_length: int, *, positions: int | None = None,
                   max_new_tokens: int = 0) -> list[tuple[list[int], Row]]:
    """Chat-templated prompt ids of each row; rows that do not fit are dropped, counted in the log.

    Args:
        rows: the rows (`read_rl_rows`).
        tokenizer: the checkpoint's.
        max_prompt_length: `data.max_prompt_length`.
        positions: the checkpoint's positions (`inputs.config_positions`); a prompt that leaves
            fewer than `max_new_tokens` of them for the response is dropped. None: no such limit.
        max_new_tokens: `rollout.max_new_tokens`.

    Raises:
        ValueError: no prompt is left (the counts per reason named).
    """
    kept, over_limit, over_positions = [], 0, 0
    for row in rows:
        ids = chat_prompt_ids(tokenizer, list(row.prompt))
        if len(ids) > max_prompt_length:
            over_limit += 1
        elif positions is not None and len(ids) + max_new_tokens > positions:
            over_positions += 1
        else:
            kept.append((ids, row))
    check_kept("prompts", len(rows), {
        f"longer than data.max_prompt_length={max_prompt_length} tokens": over_limit,
        f"whose prompt + rollout.max_new_tokens={max_new_tokens} exceed the checkpoint's {positions} positions "
        "(config.json)": over_positions},
        "raise data.max_prompt_length, lower rollout.max_new_tokens (the checkpoint's positions hold prompt and "
        "response), or pass shorter prompts")
    return kept


def rl_prompts(cfg: RLRecipeConfig, tokenizer: Any) -> list[tuple[list[int], Row]]:
    """The RL run's prompts: `data.train_files` read and checked, encoded within `data.max_prompt_length`
    and the checkpoint's positions (read from its config.json: no weights load)."""
    data, ckpt = cfg.data, cfg.checkpoint
    return encode_prompts(read_rl_rows(data.train_files), tokenizer, data.max_prompt_length,
                          positions=config_positions(read_config(ckpt.checkpoint)),
                          max_new_tokens=cfg.rollout.max_new_tokens)


__all__ = ["encode_prompts", "known_data_source", "read_rl_file", "read_rl_rows", "rl_prompts"]

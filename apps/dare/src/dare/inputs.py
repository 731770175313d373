"""Input checks that run before anything is written or loaded: checkpoint folders, data files and
their columns, `dare eval` arguments (and `dare eval`'s warnings about prompts a model cannot read).

Each check reads as little as it can (config.json, file names, a parquet schema, a safetensors
header) and raises `ValueError` naming the field, the bad value and the fix, so the CLI prints
one line instead of a traceback, and the run folder stays untouched.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from dare.config_tree import did_you_mean
from dllm_models import NoWeightsError, family_for, has_tokenizer, read_config, weight_files


def check_checkpoint(folder: str, *, family: str | None = None, field: str = "checkpoint.checkpoint",
                     weights: bool = True, tokenizer: bool = True) -> str:
    """Raise unless `folder` is a loadable checkpoint folder; return its canonical family name.

    Args:
        folder: the checkpoint folder path.
        family: the family the run expects (`checkpoint.family`); None: any.
        field: how the user set `folder` (for the message).
        weights: require safetensors (a single file, or an index whose shards all exist).
        tokenizer: require tokenizer vocabulary files.

    Raises:
        ValueError: empty path, no folder, no or unreadable config.json, unknown `model_type`,
            missing weights or tokenizer, or a family other than `family`.
    """
    if not folder:
        raise ValueError(f"{field} is empty: pass {field}=/path/to/model/folder")
    root = Path(folder)
    try:
        raw = read_config(root)
        name = family_for(raw).name
        if weights:
            weight_files(root)
    except NoWeightsError:
        raise ValueError(f"{field}={folder!r} has no weights (no model.safetensors, or model.safetensors.index.json "
                         "with its shards): copy the release's safetensors files into the folder") from None
    except ValueError as err:
        raise ValueError(f"{field}={folder!r} is not a model folder: {err}") from None
    if tokenizer and not has_tokenizer(root):
        raise ValueError(f"{field}={folder!r} has no tokenizer (tokenizer.json, or vocab.json + merges.txt): "
                         "copy the release's tokenizer files (with tokenizer_config.json) into the folder")
    if family is not None:
        check_family_name(family, name, folder)
    return name


def check_family_name(family: str, actual: str, folder: str) -> None:
    """Raise if the run's `checkpoint.family` is not the checkpoint's canonical family `actual`."""
    if family != actual:
        raise ValueError(
            f"checkpoint.family={family!r}, but {folder} holds a {actual!r} model (config.json model_type "
            f"read through dllm_models' family registry); use a {actual}-<algorithm> recipe (see "
            f"`dare recipes`) or set checkpoint.family={actual}")


def check_block_length(block_length: int, native: int | None, folder: str) -> None:
    """Raise if `rollout.block_length` is not the block size of a block-diffusion checkpoint (`native`;
    None: masked diffusion, any block length): `dllm_rollout.on_model_grid`'s rule, the one `generate`
    and `dare eval` apply, checked before anything loads. A run would otherwise decode with the model's
    block size while config.json records another."""
    from dllm_rollout import SamplingConfig, on_model_grid

    try:
        on_model_grid(SamplingConfig(max_new_tokens=block_length, steps=1, block_length=block_length,
                                     block_diffusion=native is not None), native)
    except ValueError:
        raise ValueError(f"rollout.block_length={block_length}, but {folder} is a block-diffusion model with "
                         f"block size {native}: it decodes on the grid its attention mask uses (dare eval "
                         f"refuses another too); set rollout.block_length={native} or drop the override") from None


def check_rollout_engine(rollout: Any, model: Any, algorithm: Any, folder: str) -> None:
    """Raise, before anything is written, if the rollout backend cannot serve this run: it does not
    fill a rollout record field the algorithm or the settings need (`dllm_train.check_rollout_record`),
    the engine's package is not installed, or the model, algorithm or settings are ones it cannot
    decode (`dllm_train.engine_rollout.check_engine_support`). `model`: the checkpoint on the meta
    device."""
    from dllm_train import check_rollout_record, sampling_for

    check_rollout_record(algorithm, sampling_for(model, rollout, algorithm))
    if rollout.engine == "native":
        return
    import importlib.util

    from dllm_train.engine_rollout import check_engine_support

    if importlib.util.find_spec(rollout.engine) is None:
        raise ValueError(f"rollout.engine={rollout.engine} needs the {rollout.engine} extra, which is not "
                         f"installed: pip install 'dllm-rollout[{rollout.engine}]', or set rollout.engine=native")
    check_engine_support(str(model.traits.family), algorithm, sampling_for(model, rollout, algorithm), folder)


def train_file_entries(train_files: str, *, names: Collection[str] = ()) -> list[str]:
    """The comma-separated entries of `data.train_files`; raise unless each is one of `names` or a
    parquet file with rows (`check_parquet_file`)."""
    entries = [s.strip() for s in train_files.split(",") if s.strip()]
    if not entries:
        raise ValueError("data.train_files is empty: pass data.train_files=<parquet path>[,...]"
                         + (f" or a dataset name ({', '.join(names)})" if names else ""))
    for entry in entries:
        if entry in names:
            continue
        if not Path(entry).exists():
            also = f" nor one of the shipped datasets {list(names)}" if names else ""
            hint = did_you_mean(entry, names)
            raise ValueError(f"data.train_files entry {entry!r} is not a file{also}{hint}; pass parquet paths, "
                             "comma-separated")
        check_parquet_file(entry)
    return entries


def check_parquet_file(path: str | Path, field: str = "data.train_files") -> int:
    """Raise unless `path` is a parquet file with at least one row; return its row count.

    Reads the footer only. A folder, a file pyarrow cannot read as parquet and a file without
    rows each get their own message, naming `field` and the path.
    """
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    p = Path(path)
    if p.is_dir():
        inside = sorted(str(f) for f in p.glob("*.parquet"))
        listed = f" (it holds {len(inside)}: {','.join(inside[:3])}{',...' if len(inside) > 3 else ''})" if inside else ""
        raise ValueError(f"{field} entry {str(path)!r} is a folder, not a parquet file{listed}; pass the parquet "
                         f"files themselves, comma-separated: {field}=a.parquet,b.parquet")
    if not p.is_file():
        raise ValueError(f"{field} entry {str(path)!r} is not a file; pass parquet paths, comma-separated")
    try:
        rows = int(pq.read_metadata(p).num_rows)
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"{field} entry {str(path)!r} is not a parquet file ({err}); write the data as parquet "
                         "(pandas: pd.read_json(...).to_parquet('data.parquet')) and pass that file") from None
    if rows == 0:
        raise ValueError(f"{field} entry {str(path)!r} has no rows (an empty parquet file); pass a file with "
                         "examples, or drop it from the list")
    return rows


def config_positions(raw: dict[str, Any]) -> int | None:
    """The positions a checkpoint was built for, from its config.json dict (`max_sequence_length`
    of LLaDA, `max_position_embeddings` of the others); None when it states none."""
    for key in ("max_sequence_length", "max_position_embeddings"):
        value = raw.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_rl_columns(path: str | Path) -> None:
    """Raise unless an RL parquet file has the RL schema (read from its footer, not its rows).

    Columns: `prompt` (chat messages, or their JSON text), `data_source`, and the answer as
    `ground_truth` or `reward_model.ground_truth`; `extra_info` is optional.
    """
    import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    check_parquet_file(path)
    schema = pq.read_schema(path)
    names = list(schema.names)
    missing = [c for c in ("prompt", "data_source") if c not in names]
    answer = "ground_truth" in names
    if "reward_model" in names and pa.types.is_struct(schema.field("reward_model").type):
        rm = schema.field("reward_model").type
        answer = answer or "ground_truth" in [rm.field(i).name for i in range(rm.num_fields)]
    if not answer:
        missing.append("ground_truth (or reward_model.ground_truth)")
    if missing:
        raise ValueError(
            f"{path}: RL data needs columns 'prompt' (chat messages), 'data_source' and 'ground_truth' or "
            f"'reward_model.ground_truth'; missing {missing} (the file has {names}). Rename or add the "
            "columns and write the parquet again (schema in apps/dare/README.md)")


def check_rl_data(train_files: str, *, names: Collection[str] = ()) -> None:
    """Raise unless every `data.train_files` entry is a shipped dataset name or an RL parquet file."""
    for entry in train_file_entries(train_files, names=names):
        if entry not in names:
            check_rl_columns(entry)


def check_output_dir(output_dir: str | Path | None, *, flag: str = "--output-dir") -> None:
    """Raise if the output folder path names an existing file."""
    if output_dir is not None and Path(output_dir).exists() and not Path(output_dir).is_dir():
        raise ValueError(f"{flag} {str(output_dir)!r} is a file, not a folder; pass a folder path "
                         "(it is created if missing)")


def check_eval_inputs(checkpoint: str, output_dir: str | None, *, harness: str = "native") -> None:
    """`dare eval`'s checks before any model is loaded or decoded: the checkpoint folder (config.json,
    weights and tokenizer for the native harness) and the output folder."""
    check_output_dir(output_dir)
    check_checkpoint(checkpoint, field="checkpoint", weights=harness == "native",
                     tokenizer=harness == "native")


def max_positions(model: Any) -> int | None:
    """The positions a checkpoint was built for (config.json `max_sequence_length` of LLaDA,
    `max_position_embeddings` of the others); None when the config states none."""
    cfg = getattr(model, "config", None)
    for key in ("max_sequence_length", "max_position_embeddings"):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _chat_ids(tokenizer: Any, messages: list[Any]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out if isinstance(out, list) else out["input_ids"]
    return list(ids)


def eval_prompt_warnings(model: Any, tokenizer: Any, bench: Any, preset: Any, max_new_tokens: int, *,
                         limit: int | None) -> list[str]:
    """Why a `dare eval` score may mean nothing, found before any decoding: the tokenizer drops
    part of the prompt text (characters outside its vocabulary), or prompt + `max_new_tokens`
    exceeds the positions the model was built for.

    Args:
        model, tokenizer: the checkpoint's.
        bench, preset: a dllm_eval benchmark and preset (their prompts, as the runner builds them).
        max_new_tokens: the decoding length.
        limit: the rows evaluated (first N; None: all).

    Returns:
        One message per problem (empty: none found).
    """
    rows = bench.load(limit=limit, preset=preset)
    if not rows:
        return []
    texts = [" ".join(str(m["content"]) for m in bench.messages(row, preset)) for row in rows]
    lengths = [len(_chat_ids(tokenizer, bench.messages(row, preset))) for row in rows]
    chars = sum(len("".join(t.split())) for t in texts)
    kept = sum(len("".join(tokenizer.decode(tokenizer.encode(t, add_special_tokens=False),
                                             skip_special_tokens=True).split())) for t in texts)
    warnings = []
    if chars and kept < 0.95 * chars:
        warnings.append(
            f"{bench.name}: the tokenizer keeps only {kept / chars:.0%} of the prompt text (the rest is "
            "outside its vocabulary), so the model never sees most of each question; the score will mean "
            "little. Evaluate a checkpoint whose tokenizer covers the benchmark's text")
    positions = max_positions(model)
    longest = max(lengths)
    if positions is not None and longest + max_new_tokens > positions:
        over = sum(n + max_new_tokens > positions for n in lengths)
        fix = ("the prompts alone are too long for it: evaluate a model with more positions" if longest >= positions
               else "lower --max-new-tokens, or evaluate a model with more positions")
        warnings.append(
            f"{bench.name}: {over} of {len(lengths)} prompts plus max_new_tokens={max_new_tokens} exceed the "
            f"model's {positions} positions (longest prompt {longest} tokens); the model decodes at positions "
            f"it was never trained on: {fix}")
    return warnings


__all__ = ["check_block_length", "check_checkpoint", "check_eval_inputs", "check_family_name", "check_output_dir", "check_parquet_file",
           "check_rl_columns", "check_rl_data", "check_rollout_engine", "config_positions", "eval_prompt_warnings",
           "max_positions", "train_file_entries"]

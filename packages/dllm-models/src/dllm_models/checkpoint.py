"""Checkpoint folders: load a HF-layout folder natively, save one atomically."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from dllm_models.protocol import is_token_id
from dllm_models.registry import build_model

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


class CheckpointFilesError(FileNotFoundError, ValueError):
    """A checkpoint folder lacks a file it needs: an error the user fixes (a ValueError), and a
    FileNotFoundError for callers that catch file errors."""


class NoWeightsError(CheckpointFilesError):
    """A checkpoint folder holds no safetensors weights (config.json only); `folder` names it, so
    a caller can word its own fix (the CLI does)."""

    def __init__(self, message: str, folder: Path) -> None:
        super().__init__(message)
        self.folder = folder


def read_config(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The config.json of a checkpoint folder as a dict.

    Raises:
        CheckpointFilesError: the folder does not exist or has no config.json.
        ValueError: config.json is not a JSON object.
    """
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise CheckpointFilesError(f"checkpoint folder {str(root)!r} does not exist (or is not a folder); "
                                   "pass the folder holding config.json, the safetensors and the tokenizer")
    path = root / "config.json"
    if not path.is_file():
        raise CheckpointFilesError(f"{path} not found: a checkpoint folder needs a config.json; pass the "
                                   "folder holding config.json, the safetensors and the tokenizer")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore the release's config.json") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} holds a {type(cfg).__name__}, not a JSON object; restore the release's config.json")
    return cfg


def generation_stop_ids(checkpoint_dir: str | os.PathLike[str]) -> tuple[int, ...]:
    """The ids that end a response by the folder's generation_config.json (`eos_token_id`, an id or
    a list of ids, in its order); () when the folder has no such file or key.

    Raises:
        ValueError: the file is not a JSON object, or `eos_token_id` holds something other than
            token ids (the file and the value named).
    """
    path = Path(checkpoint_dir) / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        gen = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); restore the release's generation_config.json "
                         "or delete it (the EOS of config.json then ends responses)") from None
    if not isinstance(gen, dict):
        raise ValueError(f"{path} holds a {type(gen).__name__}, not a JSON object; restore the release's file")
    eos = gen.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(map(is_token_id, ids)):
        raise ValueError(f"{path}: eos_token_id={eos!r} must be a token id or a list of token ids >= 0; "
                         "restore the release's generation_config.json")
    return tuple(dict.fromkeys(int(t) for t in ids))


def with_stop_ids(model: nn.Module, stop_ids: tuple[int, ...]) -> nn.Module:
    """`model` with `stop_ids` as its traits' `stop_token_ids` (in place; none given: unchanged)."""
    traits = getattr(model, "traits", None)
    if stop_ids and traits is not None:
        setattr(model, "traits", dataclasses.replace(traits, stop_token_ids=stop_ids))
    return model


def _resolve_dtype(dtype: torch.dtype | str | None, raw: dict[str, Any]) -> torch.dtype:
    """The parameter dtype: `dtype`, else config.json's, else float32; only float dtypes load."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; choose one of {sorted(_DTYPES)} "
                             "(model parameters are floating point)")
        return dtype
    name = dtype or raw.get("torch_dtype") or raw.get("dtype") or "float32"
    if name not in _DTYPES:
        source = "" if dtype else " (config.json's torch_dtype; pass dtype= to override it)"
        raise ValueError(f"dtype {name!r} is not supported{source}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


@contextlib.contextmanager
def _open_safetensors(path: Path, device: str = "cpu") -> Iterator[Any]:
    """`safe_open(path)`; a damaged or truncated file raises ValueError naming its path."""
    try:
        handle = safe_open(str(path), framework="pt", device=device)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is damaged or truncated, not a readable safetensors file ({err}); "
                         "copy it again from the release (a torn download or copy leaves it short)") from None
    with handle as f:
        yield f


def _read_index(index: Path) -> dict[str, str]:
    """The `weight_map` of a model.safetensors.index.json (tensor name -> shard file in the folder).

    Raises:
        ValueError: the file is not JSON (torn, empty) or its `weight_map` is not a non-empty
            object of tensor names to shard file names of the same folder; the message names the file.
    """
    fix = "copy model.safetensors.index.json again from the release (a torn download or copy leaves it short)"
    try:
        raw = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{index} is not valid JSON ({err}); {fix}") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        got = type(weight_map).__name__ if isinstance(raw, dict) and "weight_map" in raw else "no weight_map"
        raise ValueError(f"{index} needs a non-empty \"weight_map\" object (tensor name -> shard file), "
                         f"found {got}; {fix}")
    bad = next(((k, v) for k, v in weight_map.items()
                if not isinstance(v, str) or not v or Path(v).name != v or v in (".", "..")), None)
    if bad is not None:
        raise ValueError(f"{index}: weight_map[{bad[0]!r}] = {bad[1]!r} is not the file name of a shard in "
                         f"the folder; {fix}")
    return weight_map


def weight_files(checkpoint_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Map of tensor name -> safetensors file name, from the index or the single file."""
    root = Path(checkpoint_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_index(index)
        missing = sorted({f for f in weight_map.values() if not (root / f).is_file()})
        if missing:
            raise CheckpointFilesError(
                f"{index} lists {len(missing)} safetensors shard(s) missing from the folder "
                f"(first: {missing[0]}); copy every shard of the release into {root}"
            )
        return weight_map
    single = root / "model.safetensors"
    if single.is_file():
        with _open_safetensors(single) as f:
            return {k: "model.safetensors" for k in f.keys()}
    raise NoWeightsError(
        f"checkpoint folder {root} has no weights (no model.safetensors or "
        "model.safetensors.index.json with its shards): copy the release's safetensors files into "
        "it, or call load_model(..., load_weights=False) to build the architecture with fresh weights",
        root,
    )


def _load_state(model: nn.Module, root: Path, device: torch.device, dtype: torch.dtype) -> None:
    weight_map = weight_files(root)
    expected = set(model.state_dict())
    missing = expected - set(weight_map)
    unexpected = set(weight_map) - expected
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {root} does not match the {type(model).__name__} architecture: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = root / shard
        with _open_safetensors(path, str(device)) as f:
            for name in f.keys():
                found = tuple(f.get_slice(name).get_shape())
                if found != shapes[name]:
                    raise ValueError(
                        f"tensor {name!r} in {path} has shape {list(found)}, but the {type(model).__name__} "
                        f"built from {root / 'config.json'} expects {list(shapes[name])}: config.json and the "
                        "weights come from different models; restore the release's config.json")
                tensor = f.get_tensor(name).to(dtype)
                if tensor.device.type == "cpu" and tensor.data_ptr() % 64:
                    # a tensor read straight from the file's buffer may sit at any byte offset; CPU
                    # kernels then take unaligned paths (slower, and rounding that differs from the
                    # saved model's): give it memory of its own
                    tensor = tensor.clone()
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise ValueError(
                        f"tensor {name!r} in {path} holds non-finite values (NaN or Inf) as {dtype}: the "
                        "checkpoint is corrupt (e.g. saved after a diverged step) or overflows this dtype; "
                        "load an earlier checkpoint, or a wider dtype")
                state[name] = tensor
    model.load_state_dict(state, strict=True, assign=True)


def load_model(
    checkpoint_dir: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    load_weights: bool = True,
    seed: int = 0,
) -> nn.Module:
    """Load a checkpoint folder natively: the family comes from config.json, no remote code.

    Args:
        checkpoint_dir: folder with config.json and (unless load_weights=False) safetensors,
            sharded through model.safetensors.index.json or a single model.safetensors.
        dtype: parameter dtype; defaults to config.json's `torch_dtype`, else float32.
        device: where the parameters live; "meta" builds shapes only.
        load_weights: False builds the architecture with fresh random weights (seeded by `seed`).
        seed: seed of the fresh weights when load_weights is False.

    Returns:
        The model in eval mode; `model.state_dict()` keys equal the checkpoint's weight names.
        Its `traits.stop_token_ids` are generation_config.json's EOS ids, where the folder has one.

    Raises:
        CheckpointFilesError (a ValueError): no folder, no config.json, or (load_weights) no
            safetensors or a missing shard.
        ValueError: unknown `model_type`, a generation_config.json whose `eos_token_id` is not
            token ids, a dtype other than float32/bfloat16/float16, a
            damaged or truncated safetensors file (its path named), a tensor whose shape does
            not fit the architecture (its name, file and both shapes named), or a tensor holding
            NaN or Inf after the cast to `dtype` (named).
    """
    root = Path(checkpoint_dir)
    raw = read_config(root)
    torch_dtype = _resolve_dtype(dtype, raw)
    target = torch.device(device) if device is not None else torch.device("cpu")
    with torch.device("meta"):
        model = with_stop_ids(build_model(raw), generation_stop_ids(root))
    if target.type == "meta":
        return model.to(dtype=torch_dtype).eval()
    if load_weights:
        _load_state(model, root, target, torch_dtype)
    else:
        model = model.to_empty(device=target)
        gen = torch.Generator().manual_seed(seed)
        reset = getattr(model, "reset_parameters")
        reset(generator=gen)
        model = model.to(dtype=torch_dtype)
    logger.info("loaded %s from %s (%s, %s)", type(model).__name__, root, torch_dtype, target)
    return model.eval()


def _shard(state: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def save_model(
    model: nn.Module,
    checkpoint_dir: str | os.PathLike[str],
    *,
    max_shard_bytes: int = 5 * 1024**3,
    tokenizer: Any = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write a checkpoint folder laid out like the original release, atomically.

    The folder is written under a temporary name beside the target and renamed into place, so a
    crash never leaves a half-written checkpoint. Layout: config.json, model.safetensors (or
    shards model-0000i-of-0000n.safetensors plus model.safetensors.index.json), tokenizer files,
    and a generation_config.json listing the model's stop ids when it has more than its EOS
    (`DiffusionTraits.stop_ids`; `load_model` reads them back) and `extra_files` brings none.

    Args:
        model: a family module with `config.to_hf()`.
        checkpoint_dir: target folder (replaced if it exists).
        max_shard_bytes: largest shard size.
        tokenizer: optional transformers tokenizer saved alongside.
        extra_files: optional name -> text files to add (e.g. a generation_config.json).

    Returns:
        The target path.
    """
    target = Path(checkpoint_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        raw = getattr(model, "config").to_hf()
        raw["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
        # tensors stay where they live; each shard is copied to host memory only while it is written,
        # so saving an 8B model on a GPU holds one shard (<= max_shard_bytes) in host memory, not 16 GB
        state = {k: v.detach() for k, v in model.state_dict().items()}
        shards = _shard(state, max_shard_bytes)

        def on_host(shard: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v.contiguous().cpu() for k, v in shard.items()}

        if len(shards) == 1:
            save_file(on_host(shards[0]), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(on_host(shard), str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({k: fname for k in shard})
            total = sum(t.numel() * t.element_size() for t in state.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        traits = getattr(model, "traits", None)
        if traits is not None and len(traits.stop_ids) > 1 and "generation_config.json" not in (extra_files or {}):
            gen = {"eos_token_id": list(traits.stop_ids), "pad_token_id": traits.pad_token_id}
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _replace_dir(src: Path, dst: Path) -> None:
    """Move `src` to `dst`, replacing an existing `dst` with at most a moment of absence."""
    for f in src.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def save_leftovers(folder: str | os.PathLike[str]) -> list[Path]:
    """The folders an interrupted `save_model` into `folder` left behind: its temporary copy
    (`.<name>.tmp-*`) and the previous version it was replacing (`.<name>.old-<pid>`).

    A writer that holds the folder alone may remove them (`shutil.rmtree`); a concurrent
    `save_model` into the same folder would lose its temporary copy.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if _SAVE_LEFTOVER.match(p.name) and p.is_dir() and not p.is_symlink())


_SAVE_LEFTOVER = re.compile(r"^\..+\.(tmp-.+|old-\d+)$")


def copy_tokenizer_files(src_dir: str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> None:
    """Copy the tokenizer files a release folder carries into another folder."""
    for name in _TOKENIZER_FILES:
        p = Path(src_dir) / name
        if p.is_file():
            shutil.copy2(p, Path(dst_dir) / name)

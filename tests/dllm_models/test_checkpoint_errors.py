"""`load_model` names the culprit (issue #25 item 7): the tensor, the file and both shapes on a
shape mismatch; the path of a truncated safetensors file; the valid dtypes; the first tensor
holding non-finite values. Each of these was a raw torch/safetensors error or a silent load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_models import load_model, save_model
from tests.dllm_models.tiny_configs import build_tiny


def _saved(tmp_path: Path, **save: int) -> Path:
    folder = tmp_path / "m"
    save_model(build_tiny("sdar"), folder, **save)
    return folder


def test_shape_mismatch_names_the_tensor_the_file_and_both_shapes(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    path = folder / "model.safetensors"
    state = load_file(str(path))
    name = "model.embed_tokens.weight"
    expected = tuple(state[name].shape)
    state[name] = torch.zeros(expected[0] + 3, expected[1])
    save_file(state, str(path))
    with pytest.raises(ValueError) as err:
        load_model(folder)
    msg = str(err.value)
    assert name in msg and str(path) in msg
    assert f"{list(expected)}" in msg and f"{[expected[0] + 3, expected[1]]}" in msg


def test_shape_mismatch_in_a_shard_names_that_shard(tmp_path: Path) -> None:
    folder = _saved(tmp_path, max_shard_bytes=20_000)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    name = "lm_head.weight"
    shard = folder / weight_map[name]
    state = load_file(str(shard))
    state[name] = state[name][:-1].clone()
    save_file(state, str(shard))
    with pytest.raises(ValueError, match=rf"{name}.*{shard.name}"):
        load_model(folder)


@pytest.mark.parametrize("keep", [0.5, 0.999])  # torn in the tensor data, or just before the end
def test_truncated_safetensors_names_its_path(tmp_path: Path, keep: float) -> None:
    folder = _saved(tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=rf"{path}.*(truncated|damaged)"):
        load_model(folder)


def test_truncated_header_names_its_path(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match=str(path)):
        load_model(folder)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "int8", "float64x"])
def test_non_float_dtypes_are_refused_with_the_valid_list(tmp_path: Path, dtype: object) -> None:
    folder = _saved(tmp_path)
    with pytest.raises(ValueError, match=r"dtype .* is not supported; choose one of .*bfloat16.*float16.*float32"):
        load_model(folder, dtype=dtype)  # type: ignore[arg-type]


def test_float_dtypes_given_as_torch_dtypes_still_load(tmp_path: Path) -> None:
    folder = _saved(tmp_path)
    for dtype in (torch.float32, torch.bfloat16, "float16"):
        model = load_model(folder, dtype=dtype)
        assert next(model.parameters()).dtype == (getattr(torch, dtype) if isinstance(dtype, str) else dtype)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_weights_name_the_tensor_and_file(tmp_path: Path, bad: float) -> None:
    folder = _saved(tmp_path)
    path = folder / "model.safetensors"
    state = load_file(str(path))
    name = "model.norm.weight"
    state[name][1] = bad
    save_file(state, str(path))
    with pytest.raises(ValueError, match=rf"{name}.*{path}.*non-finite"):
        load_model(folder)


def test_overflow_on_conversion_is_caught(tmp_path: Path) -> None:
    # finite in the file (float32), infinite once cast to float16: the loaded weights are checked
    folder = _saved(tmp_path)
    path = folder / "model.safetensors"
    state = load_file(str(path))
    state["model.norm.weight"][0] = 1e6
    save_file(state, str(path))
    assert load_model(folder, dtype="float32") is not None
    with pytest.raises(ValueError, match="model.norm.weight.*non-finite"):
        load_model(folder, dtype="float16")


@pytest.mark.parametrize(("content", "why"), [
    ("", "is not valid JSON"),  # empty
    ('{"metadata": {"total_size": 1}, "weight_m', "is not valid JSON"),  # torn
    ('{"metadata": {}}', 'needs a non-empty "weight_map" object.*found no weight_map'),
    ('{"weight_map": ["a"]}', 'needs a non-empty "weight_map" object.*found list'),
    ("[1, 2]", 'needs a non-empty "weight_map"'),
    ('{"weight_map": {"model.norm.weight": 3}}', r"weight_map\['model.norm.weight'\] = 3 is not the file name"),
    ('{"weight_map": {"model.norm.weight": "../../outside.safetensors"}}', "is not the file name of a shard"),
])
def test_a_broken_index_names_the_file(tmp_path: Path, content: str, why: str) -> None:
    # issue #38 L1: a raw JSONDecodeError or KeyError: 'weight_map', without the file's name
    folder = _saved(tmp_path, max_shard_bytes=20_000)
    index = folder / "model.safetensors.index.json"
    index.write_text(content)
    with pytest.raises(ValueError, match=rf"{index}.*{why}.*copy model.safetensors.index.json again"):
        load_model(folder)

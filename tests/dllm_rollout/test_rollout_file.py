"""The rollout record on disk: save/load round trips every field exactly; newer versions and other files are refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dllm_rollout import (
    RECORD_FIELDS,
    RECORD_VERSION,
    RolloutBatch,
    generate,
    load_rollout,
    rollout_bytes,
    rollout_from_bytes,
    save_rollout,
)


def _same(a: RolloutBatch, b: RolloutBatch) -> None:
    assert a.filled_fields() == b.filled_fields()
    for name, spec in RECORD_FIELDS.items():
        x = a.extras.get(name) if spec.in_extras else getattr(a, name)
        y = b.extras.get(name) if spec.in_extras else getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape, name
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)  # NaN confidences outside blocks
        else:
            assert x == y, name
    assert a.extras.keys() == b.extras.keys()


def test_a_block_record_with_every_field_round_trips(tiny_block_model: torch.nn.Module, tmp_path: Path) -> None:
    out = generate(tiny_block_model, [[1, 2, 3], [4, 5]], max_new_tokens=10, steps=4, block_length=4, temperature=1.0,
                   seed=2, threshold=0.3, editing_threshold=0.5, record_steps=True, ref_model=tiny_block_model)
    assert out.filled_fields() == set(RECORD_FIELDS)  # every field of the schema is exercised
    save_rollout(out, tmp_path / "r.safetensors")
    back = load_rollout(tmp_path / "r.safetensors")
    _same(out, back)
    assert back.config == out.config and back.config is not None and back.config.speed == out.config.speed


def test_a_masked_record_and_one_without_config_round_trip(tiny_llada: torch.nn.Module) -> None:
    out = generate(tiny_llada, [[1, 2, 3]], max_new_tokens=8, steps=4, block_length=4, temperature=1.0, seed=5)
    _same(out, rollout_from_bytes(rollout_bytes(out)))
    bare = dataclasses.replace(out, config=None, forwards=None)
    back = rollout_from_bytes(rollout_bytes(bare))
    _same(bare, back)
    assert back.config is None and back.forwards is None


def test_a_newer_version_is_refused(tiny_llada: torch.nn.Module, tmp_path: Path) -> None:
    out = generate(tiny_llada, [[1, 2, 3]], max_new_tokens=8, steps=4, block_length=4, seed=5)
    path = tmp_path / "new.safetensors"
    save_rollout(dataclasses.replace(out, version=RECORD_VERSION + 1), path)
    with pytest.raises(ValueError) as err:
        load_rollout(path)
    assert str(err.value) == (f"{path}: rollout record version {RECORD_VERSION + 1} is newer than this dllm_rollout "
                              f"reads (version {RECORD_VERSION}); upgrade dllm-rollout to read it")


def test_other_files_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="not a stored rollout record"):
        load_rollout(tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="not a safetensors file"):
        rollout_from_bytes(b"abc")

"""`generate` takes one SamplingConfig, or its fields as keywords, and nothing else."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_rollout import RolloutBatch, SamplingConfig, configure, generate
from tests.dllm_rollout.conftest import tiny

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


def _same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), f.name
        elif f.name == "extras":
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), f.name
        else:
            assert x == y, f.name


def test_a_config_and_its_fields_as_keywords_decode_the_same() -> None:
    model = tiny("llada")
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0, top_k=20,
                         record_trajectory=True)
    by_config = generate(model, PROMPTS, cfg, seed=3)
    _same(by_config, generate(model, PROMPTS, seed=3, **dataclasses.asdict(cfg)))
    # keywords replace the config's fields
    _same(generate(model, PROMPTS, cfg, seed=3, temperature=0.0),
          generate(model, PROMPTS, dataclasses.replace(cfg, temperature=0.0), seed=3))
    assert by_config.config == cfg


def test_the_model_sets_the_decoding_mode() -> None:
    masked, block = tiny("llada"), tiny("sdar")
    cfg = SamplingConfig(max_new_tokens=8, steps=8, block_length=4, block_diffusion=True)
    out = generate(masked, PROMPTS, cfg)
    assert out.config is not None and not out.config.block_diffusion
    per_block = SamplingConfig(max_new_tokens=8, steps=2, block_length=4, block_diffusion=True)
    masked_cfg = dataclasses.replace(per_block, steps=8, block_diffusion=False)
    got = generate(block, PROMPTS, masked_cfg, steps=2)
    assert got.config == per_block


def test_an_unknown_setting_is_named_with_the_fix() -> None:
    model = tiny("llada")
    with pytest.raises(TypeError, match=r"tempreature=0\.5 is not a decoding setting .*did you mean 'temperature'"):
        generate(model, PROMPTS, max_new_tokens=4, steps=4, block_length=4, tempreature=0.5)
    with pytest.raises(TypeError, match="the settings are"):
        configure(None, max_new_tokens=4, steps=4, block_length=4, zzz=1)
    with pytest.raises(ValueError, match="block_length"):  # the config's own validation, with its message
        configure(None, max_new_tokens=6, steps=4, block_length=4)


def test_speed_settings_are_a_typed_section_that_round_trips() -> None:
    """`SamplingConfig.speed` holds the decoder's switches with today's defaults; its JSON form (as in a
    run's config.json or an OpenCompass config) reads back to the same config; a bad value names its field."""
    import dataclasses

    from dllm_rollout import SamplingConfig, SpeedConfig, configure

    cfg = SamplingConfig(max_new_tokens=8, steps=8, block_length=4)
    assert cfg.speed == SpeedConfig(cuda_graphs=True, fold_store=True, retire_rows=16, fused_sampling=True)
    slow = dataclasses.replace(cfg, speed=SpeedConfig(cuda_graphs=False, retire_rows=0))
    data = dataclasses.asdict(slow)
    assert data["speed"] == {"cuda_graphs": False, "fold_store": True, "retire_rows": 0, "fused_sampling": True}
    assert configure(None, **data) == slow
    with pytest.raises(ValueError, match=r"rollout\.speed\.retire_rows must be >= 0.*got -1"):
        SpeedConfig(retire_rows=-1)
    with pytest.raises(TypeError, match="rollout.speed must be a SpeedConfig"):
        SamplingConfig(max_new_tokens=8, steps=8, block_length=4, speed=True)  # type: ignore[arg-type]

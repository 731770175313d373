"""Engine translation layers on fake outputs shaped like SGLang's and lmdeploy's."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from dllm_rollout import RolloutBatch, SamplingConfig, generate
from dllm_rollout.batch import rollout_batch
from dllm_rollout.engines import (
    batch_from_lmdeploy,
    batch_from_sglang,
    batch_from_token_lists,
    lmdeploy_engine_config,
    lmdeploy_gen_config,
    sglang_algorithm,
    sglang_sampling_params,
)

CFG = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, temperature=1.0, top_k=50,
                     remasking="low_confidence_dynamic", threshold=0.9, block_diffusion=True)
PROMPTS = [[1, 2, 3], [4, 5]]
PROMPTS3 = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]


def test_sglang_arguments() -> None:
    assert sglang_sampling_params(CFG, seed=3) == {
        "max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": 50, "sampling_seed": 3, "ignore_eos": False,
    }
    # every stop id of the model (SDAR chat: <|im_end|> beside <|endoftext|>) ends a request
    assert sglang_sampling_params(CFG, stop_ids=(62, 60))["stop_token_ids"] == [62, 60]
    no_stop = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, block_diffusion=True, stop_at_eos=False)
    assert sglang_sampling_params(no_stop)["ignore_eos"] is True
    greedy = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, block_diffusion=True)
    assert sglang_sampling_params(greedy)["top_k"] == -1
    assert sglang_algorithm(CFG) == ("LowConfidence", {"block_size": 4, "threshold": 0.9})
    with pytest.raises(ValueError, match="block-diffusion"):
        sglang_algorithm(SamplingConfig(max_new_tokens=4, steps=4, block_length=4))


def test_sglang_joint_threshold_for_token_editing() -> None:
    editing = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, threshold=0.7, editing_threshold=0.5,
                             max_post_steps=8, block_diffusion=True)
    assert sglang_algorithm(editing) == ("JointThreshold", {
        "block_size": 4, "threshold": 0.7, "edit_threshold": 0.5, "max_post_edit_steps": 8,
    })
    with pytest.raises(ValueError, match="no token editing"):
        lmdeploy_engine_config(editing)


def test_sglang_outputs_to_batch() -> None:
    outputs = [
        {"text": "", "output_ids": [7, 8, 62], "meta_info": {"finish_reason": {"type": "stop"},
                                                           "dllm_replay_step_maps": [1, 2, 1]}},
        {"text": "", "output_ids": [9, 10, 11, 12, 13, 14, 15], "meta_info": {"finish_reason": {"type": "length"},
                                                                              "dllm_replay_step_maps": [1] * 7}},
    ]
    traced = dataclasses.replace(CFG, record_trajectory=True)  # step maps are kept when the trajectory is asked
    batch = batch_from_sglang(outputs, PROMPTS, torch.tensor([1, 2]), traced, stop_ids=(62,), pad_id=62)
    assert batch.response_ids.tolist() == [[7, 8, 62, 62, 62, 62], [9, 10, 11, 12, 13, 14]]
    assert batch.response_mask.tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    assert batch.unmask_step is not None and batch.unmask_step[0].tolist() == [0, 1, 0, -1, -1, -1]
    assert batch.prompt_ids.tolist() == [[1, 2, 3], [62, 4, 5]]


def test_lmdeploy_arguments_and_outputs() -> None:
    assert lmdeploy_engine_config(CFG) == {
        "dllm_block_length": 4, "dllm_denoising_steps": 4,
        "dllm_unmasking_strategy": "low_confidence_dynamic", "dllm_confidence_threshold": 0.9,
    }
    gen = lmdeploy_gen_config(CFG, stop_ids=(62,))
    assert "random_seed" not in gen  # per-row seeds would reach the wrong rows (test_lmdeploy.py)
    assert gen["include_stop_str_in_output"] and gen["stop_token_ids"] == [62] and gen["top_k"] == 50
    outs = [SimpleNamespace(text="", token_ids=[3, 62, 4], finish_reason="stop"),
            SimpleNamespace(text="", token_ids=[5], finish_reason="stop")]
    batch = batch_from_lmdeploy(outs, PROMPTS, torch.tensor([1, 2]), CFG, stop_ids=(62,), pad_id=62)
    assert batch.response_mask.tolist() == [[True, True, False, False, False, False], [True] + [False] * 5]
    # several stop ids: the config lists them all, and the mask ends at the first of any of them
    assert lmdeploy_gen_config(CFG, stop_ids=(62, 60))["stop_token_ids"] == [62, 60]
    outs = [SimpleNamespace(text="", token_ids=[3, 60, 62], finish_reason="stop"),
            SimpleNamespace(text="", token_ids=[5, 62], finish_reason="stop")]
    batch = batch_from_lmdeploy(outs, PROMPTS, torch.tensor([1, 2]), CFG, stop_ids=(62, 60), pad_id=62)
    assert batch.response_mask.tolist() == [[True, True, False, False, False, False],
                                            [True, True, False, False, False, False]]


@pytest.mark.sglang
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs the sglang extra")
def test_sglang_engine_imports() -> None:
    from dllm_rollout.engines import SGLangEngine

    assert SGLangEngine is not None


@pytest.mark.lmdeploy
@pytest.mark.skipif(importlib.util.find_spec("lmdeploy") is None, reason="needs the lmdeploy extra")
def test_lmdeploy_engine_imports() -> None:
    from dllm_rollout.engines import LMDeployEngine

    assert LMDeployEngine is not None


def _fields_equal(a: RolloutBatch, b: RolloutBatch) -> dict[str, bool]:
    """Per RolloutBatch field: whether `a` and `b` hold the same value (tensors exactly)."""
    out = {}
    for f in dataclasses.fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            out[f.name] = x.dtype == y.dtype and torch.equal(x, y)
        elif f.name == "extras":
            out[f.name] = x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        else:
            out[f.name] = x == y
    return out


# seed 7: both tiny block models end some rows with EOS inside the response
NATIVE = dict(max_new_tokens=12, steps=4, block_length=4, temperature=1.0, seed=7, eos_handling="truncate")


def test_an_engine_batch_of_the_native_tokens_is_the_native_batch(tiny_block_model: torch.nn.Module) -> None:
    """An engine that returns every token (no stop at EOS) assembles the native decoder's batch."""
    traits = tiny_block_model.traits  # type: ignore[union-attr]
    native = generate(tiny_block_model, PROMPTS3, stop_at_eos=False, **NATIVE)  # type: ignore[arg-type]
    assert native.config is not None
    engine = batch_from_token_lists(PROMPTS3, native.response_ids.tolist(), native.seeds, native.config,
                                    stop_ids=traits.stop_ids, pad_id=traits.pad_token_id)
    # every field but `forwards`, which an engine that reports no steps leaves out (record_fields_filled)
    same = _fields_equal(engine, native)
    assert same.pop("forwards") is False and engine.forwards is None and native.forwards is not None
    assert same == {f.name: True for f in dataclasses.fields(RolloutBatch) if f.name != "forwards"}


def test_an_engine_batch_cut_at_eos_counts_what_the_native_batch_counts(tiny_block_model: torch.nn.Module) -> None:
    """An engine stops at EOS (stop token kept): the same counted tokens and every other field equal;
    past the EOS it holds padding where the native decoder holds the rest of the EOS block."""
    traits = tiny_block_model.traits  # type: ignore[union-attr]
    native = generate(tiny_block_model, PROMPTS3, **NATIVE)  # type: ignore[arg-type]
    assert native.config is not None and not bool(native.response_mask.all())  # some row stopped at EOS
    cut = [row[: int(n)] for row, n in zip(native.response_ids.tolist(), native.response_mask.sum(-1))]
    engine = batch_from_token_lists(PROMPTS3, cut, native.seeds, native.config,
                                    stop_ids=traits.stop_ids, pad_id=traits.pad_token_id)
    same = _fields_equal(engine, native)
    del same["response_ids"], same["forwards"]  # forwards: the engine reports no steps (record_fields_filled)
    assert same == {f.name: True for f in dataclasses.fields(RolloutBatch) if f.name not in ("response_ids", "forwards")}
    counted = native.response_mask
    assert torch.equal(engine.response_ids[counted], native.response_ids[counted])
    assert bool((engine.response_ids[~counted] == traits.pad_token_id).all())


def test_one_assembly_refuses_unknown_records() -> None:
    ids = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="not RolloutBatch records"):
        rollout_batch(ids, ids.bool(), ids, torch.zeros(1, dtype=torch.long), CFG, stop_ids=(62,),
                      records={"step_map": ids})

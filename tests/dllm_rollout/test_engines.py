"""Engine translation layers on fake outputs shaped like SGLang's and lmdeploy's."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from dllm_rollout import SamplingConfig
from dllm_rollout.engines import (
    batch_from_lmdeploy,
    batch_from_sglang,
    lmdeploy_engine_config,
    lmdeploy_gen_config,
    sglang_algorithm,
    sglang_sampling_params,
)

CFG = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, temperature=1.0, top_k=50,
                     threshold=0.9, block_diffusion=True)
PROMPTS = [[1, 2, 3], [4, 5]]


def test_sglang_arguments() -> None:
    assert sglang_sampling_params(CFG, seed=3) == {
        "max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": 50, "sampling_seed": 3,
    }
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
    batch = batch_from_sglang(outputs, PROMPTS, torch.tensor([1, 2]), CFG, eos_id=62, pad_id=62)
    assert batch.response_ids.tolist() == [[7, 8, 62, 62, 62, 62], [9, 10, 11, 12, 13, 14]]
    assert batch.response_mask.tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    assert batch.unmask_step is not None and batch.unmask_step[0].tolist() == [0, 1, 0, -1, -1, -1]
    assert batch.prompt_ids.tolist() == [[1, 2, 3], [62, 4, 5]]


def test_lmdeploy_arguments_and_outputs() -> None:
    assert lmdeploy_engine_config(CFG) == {
        "dllm_block_length": 4, "dllm_denoising_steps": 4,
        "dllm_unmasking_strategy": "low_confidence_dynamic", "dllm_confidence_threshold": 0.9,
    }
    gen = lmdeploy_gen_config(CFG, eos_id=62)
    assert "random_seed" not in gen  # per-row seeds would reach the wrong rows (test_lmdeploy.py)
    assert gen["include_stop_str_in_output"] and gen["stop_token_ids"] == [62] and gen["top_k"] == 50
    outs = [SimpleNamespace(text="", token_ids=[3, 62, 4], finish_reason="stop"),
            SimpleNamespace(text="", token_ids=[5], finish_reason="stop")]
    batch = batch_from_lmdeploy(outs, PROMPTS, torch.tensor([1, 2]), CFG, eos_id=62, pad_id=62)
    assert batch.response_mask.tolist() == [[True, True, False, False, False, False], [True] + [False] * 5]


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

"""The rollout record: what each backend claims to fill (`record_fields_filled`) against what it returns,
and `forwards` against counted model calls."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dllm_rollout import (
    RECORD_FIELDS,
    RECORD_VERSION,
    RolloutBatch,
    SamplingConfig,
    generate,
    record_fields_filled,
    record_settings,
    requested_fields,
    tree_generate,
)
from dllm_rollout.engines import batch_from_lmdeploy, batch_from_sglang
from dllm_rollout.record_schema import ALWAYS, STEPS, TRAJECTORY, check_field_names

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
MASKED_CASES = [
    {},
    {"record_trajectory": True},
    {"record_steps": True},
    {"record_trajectory": True, "record_steps": True},
    {"threshold": 0.3, "record_trajectory": True},
]
BLOCK_CASES = [
    {},
    {"record_trajectory": True},
    {"record_steps": True, "stop_at_eos": False},
    {"record_trajectory": True, "record_steps": True},
    {"threshold": 0.3, "editing_threshold": 0.5, "record_trajectory": True},
    {"threshold": 0.3, "editing_threshold": 0.5},
]


def _claim(batch: RolloutBatch, *, reference: bool = False, backend: str | None = None) -> frozenset[str]:
    assert batch.config is not None
    return record_fields_filled(batch.config, reference=reference, backend=backend)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", MASKED_CASES)
def test_the_masked_decoder_fills_exactly_what_it_claims(tiny_llada: torch.nn.Module, case: dict[str, Any],
                                                         reference: bool) -> None:
    ref = tiny_llada if reference else None
    out = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=4, block_length=4, temperature=1.0, seed=3,
                   ref_model=ref, **case)
    assert out.filled_fields() == _claim(out, reference=reference)
    assert out.version == RECORD_VERSION
    # generate turns the trajectory on with a reference model; the claim follows the settings used
    assert ("unmask_step" in out.filled_fields()) == (bool(case.get("record_trajectory")) or reference)


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", BLOCK_CASES)
def test_the_block_decoder_fills_exactly_what_it_claims(tiny_block_model: torch.nn.Module, case: dict[str, Any],
                                                        reference: bool) -> None:
    ref = tiny_block_model if reference else None
    out = generate(tiny_block_model, PROMPTS, max_new_tokens=10, steps=4, block_length=4, temperature=1.0, seed=3,
                   ref_model=ref, **case)
    assert out.filled_fields() == _claim(out, reference=reference)
    assert ("num_edits" in out.filled_fields()) == ("editing_threshold" in case)


def test_a_reference_without_trajectory_fills_its_log_probs_alone(tiny_llada: torch.nn.Module) -> None:
    from dllm_rollout import decode, left_pad

    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)
    ids, mask = left_pad(PROMPTS, tiny_llada.traits.pad_token_id)  # type: ignore[union-attr]
    out = decode(tiny_llada, ids, mask, torch.arange(3), cfg, ref_model=tiny_llada)
    assert out.filled_fields() == record_fields_filled(cfg, reference=True) == ALWAYS | {"forwards", "ref_step_logp"}


def test_the_tree_decoder_fills_exactly_what_it_claims(tiny_llada: torch.nn.Module) -> None:
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)
    tree = tree_generate(tiny_llada, [[1, 2, 3], [4, 5]], cfg, branch_steps=[2], branching=3, seed=0)
    assert tree.leaves.filled_fields() == record_fields_filled(cfg, backend="tree")
    # quota mode: every block takes steps_per_block steps, so every leaf's path is the 4 steps of the
    # decode (2 of the shared trunk, counted for every leaf, and 2 of its own)
    assert tree.leaves.forwards is not None and tree.leaves.forwards.tolist() == [4] * 6
    with pytest.raises(ValueError, match="set record_steps=False"):
        tree_generate(tiny_llada, [[1, 2, 3]], dataclasses.replace(cfg, record_steps=True), branch_steps=[2],
                      branching=2)


class _Calls:
    """Counts a model's top-level forward calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.n += 1


@pytest.mark.parametrize("case", [{}, {"threshold": 0.2}])
def test_masked_forwards_count_the_model_calls(tiny_llada: torch.nn.Module, case: dict[str, Any]) -> None:
    # one prompt, no cache: every step is one forward of the policy
    calls = _Calls(tiny_llada)
    out = generate(tiny_llada, [[1, 2, 3]], max_new_tokens=8, steps=8, block_length=4, temperature=1.0, seed=1,
                   record_trajectory=True, **case)
    calls.handle.remove()
    assert out.forwards is not None and out.unmask_step is not None
    assert out.forwards.tolist() == [calls.n]
    # each step commits at least one token, so the steps are those the trajectory names
    assert out.forwards.tolist() == [int(out.unmask_step.max()) + 1]
    if case:  # threshold decoding commits several tokens per step where confident: fewer forwards
        assert calls.n <= 8


def test_block_forwards_count_the_model_calls(tiny_block_model: torch.nn.Module) -> None:
    calls = _Calls(tiny_block_model)
    out = generate(tiny_block_model, [[1, 2, 3]], max_new_tokens=10, steps=4, block_length=4, temperature=1.0,
                   seed=1, threshold=0.2, cache=None, record_trajectory=True)
    calls.handle.remove()
    assert out.forwards is not None and out.forwards.tolist() == [calls.n]


def test_block_forwards_per_row_follow_the_trajectory(tiny_block_model: torch.nn.Module) -> None:
    # rows stop at different blocks (stop_at_eos) and finished rows retire from the batch: each row's
    # count is its own steps, the last of which committed the last token of its response or tail
    out = generate(tiny_block_model, PROMPTS * 2, max_new_tokens=12, steps=4, block_length=4, temperature=1.0,
                   seed=7, threshold=0.3, record_trajectory=True, eos_handling="truncate")
    assert out.forwards is not None and out.unmask_step is not None
    last = torch.maximum(out.unmask_step.max(-1).values, out.extras["tail_unmask_step"].max(-1).values)
    assert out.forwards.tolist() == (last + 1).tolist()


def test_the_lmdeploy_adapter_fills_exactly_what_it_claims() -> None:
    cfg = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, block_diffusion=True)
    outputs = [SimpleNamespace(token_ids=[7, 8, 62], finish_reason="stop"),
               SimpleNamespace(token_ids=[9, 10, 11, 12, 13, 14], finish_reason="length")]
    out = batch_from_lmdeploy(outputs, PROMPTS[:2], torch.tensor([1, 2]), cfg, stop_ids=(62,), pad_id=62)
    assert out.filled_fields() == record_fields_filled(cfg, backend="lmdeploy") == ALWAYS
    assert out.forwards is None  # lmdeploy 0.18 reports no steps


def test_the_sglang_adapter_fills_exactly_what_it_claims() -> None:
    cfg = SamplingConfig(max_new_tokens=6, steps=4, block_length=4, block_diffusion=True)
    with_maps = [{"output_ids": [7, 8, 62], "meta_info": {"dllm_replay_step_maps": [1, 2, 1]}},
                 {"output_ids": [9, 10], "meta_info": {"dllm_replay_step_maps": [1, 1]}}]
    for c in (cfg, dataclasses.replace(cfg, record_trajectory=True)):
        out = batch_from_sglang(with_maps, PROMPTS[:2], torch.tensor([1, 2]), c, stop_ids=(62,), pad_id=62)
        assert out.filled_fields() == record_fields_filled(c, backend="sglang")
    bare = [{"output_ids": [7, 8, 62], "meta_info": {}}, {"output_ids": [9], "meta_info": {}}]
    with pytest.raises(ValueError, match="no step maps for prompt 0"):
        batch_from_sglang(bare, PROMPTS[:2], torch.tensor([1, 2]), dataclasses.replace(cfg, record_trajectory=True),
                          stop_ids=(62,), pad_id=62)


def test_settings_for_fields_and_fields_of_settings() -> None:
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4)
    assert record_settings(cfg, []) is cfg and requested_fields(cfg) == frozenset()
    assert requested_fields(record_settings(cfg, ["unmask_step"])) == TRAJECTORY
    assert requested_fields(record_settings(cfg, ["step_x0"])) == STEPS
    assert record_settings(cfg, ["ref_step_logp", "forwards"]) is cfg  # a reference model, and always filled
    assert set(record_fields_filled(cfg, backend="block")) <= set(RECORD_FIELDS)
    with pytest.raises(ValueError, match="rollout backend 'vllm' unknown"):
        record_fields_filled(cfg, backend="vllm")
    with pytest.raises(ValueError, match=r"algorithm x: \['step_map'\] are not rollout record fields"):
        check_field_names(["step_map", "unmask_step"], owner="algorithm x")


def test_rows_decoded_in_chunks_keep_their_record(tiny_llada: torch.nn.Module) -> None:
    # the trainer decodes `rollout.max_rows` rows at a time and concatenates them (`concat_batches`)
    from dllm_rollout.batch import concat_batches

    whole = generate(tiny_llada, PROMPTS, max_new_tokens=8, steps=8, block_length=4, temperature=1.0, seed=[1, 2, 3],
                     threshold=0.3, record_trajectory=True)
    parts = [generate(tiny_llada, PROMPTS[:2], max_new_tokens=8, steps=8, block_length=4, temperature=1.0,
                      seed=[1, 2], threshold=0.3, record_trajectory=True),
             generate(tiny_llada, PROMPTS[2:], max_new_tokens=8, steps=8, block_length=4, temperature=1.0, seed=[3],
                      threshold=0.3, record_trajectory=True)]
    traits = tiny_llada.traits  # type: ignore[union-attr]
    joined = concat_batches(parts, pad_id=traits.pad_token_id, mask_id=traits.mask_token_id)
    assert joined.filled_fields() == whole.filled_fields() and joined.version == RECORD_VERSION
    assert joined.forwards is not None and whole.forwards is not None
    assert torch.equal(joined.forwards, whole.forwards) and torch.equal(joined.response_ids, whole.response_ids)
    assert torch.equal(joined.select(torch.tensor([2, 0])).forwards, whole.forwards[[2, 0]])  # type: ignore[arg-type]

"""Memory levers: the reference of a LoRA run is the policy's base weights (no copy), an offloaded
reference scores as a resident one, activation checkpointing and chunked rollouts change nothing
but memory."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import dllm_algorithms as da
from dllm_models import apply_lora
from dllm_rollout import SamplingConfig
from dllm_train import (
    BaseWeightsScorer,
    OffloadedScorer,
    RolloutWorker,
    Scorer,
    accumulate,
    plan_token_logp,
    sample_seeds,
    set_activation_checkpointing,
)
from dllm_objectives import iid_masks
from tests.tiny_rl import TOK, addition_prompts, local_rl, tiny_model


def _batch() -> tuple[torch.Tensor, torch.Tensor, object]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 12, (4, 10), generator=g)
    attn = torch.ones(4, 10, dtype=torch.bool)
    target = attn.clone()
    target[:, :4] = False
    return ids, attn, iid_masks(target, 2, generator=g)


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    apply_lora(model, rank=2, alpha=4.0)
    with torch.no_grad():  # peft starts from B = 0 (adapters a no-op): make them matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    return model


def test_base_weights_scorer_scores_the_model_without_its_adapters() -> None:
    base = tiny_model("llada")
    model = _lora(copy.deepcopy(base))
    ids, attn, plan = _batch()
    with torch.no_grad():
        want = plan_token_logp(Scorer(base), ids, attn, plan)
        got = plan_token_logp(BaseWeightsScorer(model), ids, attn, plan)
        adapted = plan_token_logp(Scorer(model), ids, attn, plan)
    torch.testing.assert_close(got, want)
    assert float((adapted - want).abs().max()) > 1e-3  # the adapters are on again, and they matter
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_a_lora_run_scores_its_reference_on_the_policy_itself() -> None:
    model = _lora(tiny_model("llada"))
    rl = local_rl(model, da.ESPO(mc_num=2, num_iterations=1))
    assert rl.rank.reference is not None and rl.rank.reference.model is model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = rl.step(0)
    assert "kl" in metrics and torch.isfinite(torch.tensor(metrics["loss"]))
    moved = [n for n, p in model.named_parameters() if not torch.equal(before[n], p)]
    assert moved and all("lora_" in n for n in moved)  # only adapters train; the base stays the reference


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_a_base_weights_view_decodes_as_the_base_model(family: str) -> None:
    # the rollout's reference log-probs (DMPO) read through the view equal those of the base model
    from dllm_models import BaseWeightsView
    from dllm_rollout import decode

    base = tiny_model(family)
    model = _lora(copy.deepcopy(base))
    ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    mask = ids != 0
    cfg = dataclasses.replace(SAMPLING_REF, block_diffusion=family == "sdar")
    seeds = torch.tensor([1, 2])
    via_view = decode(model, ids, mask, seeds, cfg, BaseWeightsView(model))
    via_copy = decode(model, ids, mask, seeds, cfg, base)
    assert torch.equal(via_view.response_ids, via_copy.response_ids)
    assert via_view.ref_step_logp is not None and via_copy.ref_step_logp is not None
    torch.testing.assert_close(via_view.ref_step_logp, via_copy.ref_step_logp)
    assert not torch.equal(via_view.ref_step_logp, via_view.step_logp)  # the adapters matter to the policy
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_a_lora_dmpo_run_reads_its_rollout_reference_without_a_copy() -> None:
    from dllm_models import BaseWeightsView

    model = _lora(tiny_model("llada"))
    rl = local_rl(model, da.DMPO(mc_num=2, num_iterations=1))
    ref = rl.rank.rollout.ref_model
    assert isinstance(ref, BaseWeightsView) and ref.model is model
    assert torch.isfinite(torch.tensor(rl.step(0)["loss"]))


SAMPLING_REF = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0, record_trajectory=True)


def test_an_offloaded_reference_scores_as_a_resident_one() -> None:
    model = tiny_model("sdar")
    ids, attn, plan = _batch()
    with torch.no_grad():
        want = plan_token_logp(Scorer(model), ids, attn, plan)
        got = plan_token_logp(OffloadedScorer(copy.deepcopy(model), device="cpu"), ids, attn, plan)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_activation_checkpointing_gives_the_same_gradients(family: str) -> None:
    model = tiny_model(family, dtype=torch.float64).train()
    ids, attn, plan = _batch()

    def values(s: object) -> torch.Tensor:
        return plan_token_logp(s, ids, attn, plan)  # type: ignore[arg-type]

    grads = []
    for on in (False, True):
        set_activation_checkpointing(model, on)
        model.zero_grad(set_to_none=True)
        accumulate(values, lambda v: (v.exp().sum(), {}), Scorer(model), max_tokens=20, row_local=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n])


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_a_rollout_in_row_chunks_equals_the_whole_batch(family: str) -> None:
    model = tiny_model(family)
    prompts, _, _ = addition_prompts(3, 2)(0).expanded()
    seeds = sample_seeds(0, len(prompts), "rollout", 0)
    base = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0, record_trajectory=True,
                          record_steps=family == "llada")
    whole = RolloutWorker(model, base).generate(prompts, seeds)
    chunked = RolloutWorker(model, dataclasses.replace(base, max_rows=4)).generate(prompts, seeds)
    for f in dataclasses.fields(whole):
        a, b = getattr(whole, f.name), getattr(chunked, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(torch.nan_to_num(a, nan=-7.0) if a.is_floating_point() else a,
                               torch.nan_to_num(b, nan=-7.0) if b.is_floating_point() else b), f.name
    assert TOK.mask_token_id is not None


def test_the_rollout_metrics_count_failed_graph_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode whose CUDA-graph captures failed (and ran eagerly) says so in the rollout metrics
    (`graph_capture_failures`: this decode's failures, from `dllm_rollout.graphs.capture_failures`)."""
    from dllm_rollout import graphs

    counts = iter([5, 7])
    monkeypatch.setattr(graphs, "capture_failures", lambda: next(counts))
    prompts, _, _ = addition_prompts(1, 2)(0).expanded()
    worker = RolloutWorker(tiny_model("llada"), SamplingConfig(max_new_tokens=4, steps=4, block_length=4))
    worker.generate(prompts, sample_seeds(0, len(prompts), "rollout", 0))
    assert worker.last_metrics == {"graph_capture_failures": 2.0}

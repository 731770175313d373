"""Fused q/k/v and gate/up projections while decoding (`dllm_models.fusion`): the same function as the
separate GEMMs (float64), nothing left behind, and only plain dense layers fused."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from dllm_models.fusion import fused_projections
from tests.dllm_models.tiny_configs import build_tiny

# Qwen-layout families: (fused layers of a 2-layer tiny model: attention + dense MLP per layer)
FAMILIES = {"sdar": 4, "Dream": 4, "sdar_moe": 2}  # SDAR-MoE: its experts keep separate GEMMs


def _inputs(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (3, 9), generator=g)
    attn = torch.ones(3, 9, dtype=torch.bool)
    attn[0, :2] = False
    return ids, attn


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fused_projections_compute_the_same_function(family: str) -> None:
    model = build_tiny(family).double().eval()
    ids, attn = _inputs(model)
    keys = sorted(model.state_dict())
    params = [p.data_ptr() for p in model.parameters()]
    with torch.no_grad():
        ref = model(ids, attention_mask=attn, use_cache=True)
        with fused_projections(model) as n:
            assert n == FAMILIES[family]
            got = model(ids, attention_mask=attn, use_cache=True)
            assert sorted(model.state_dict()) == keys  # the copies are no parameters or buffers
    torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=1e-12)
    for a, b in zip(got.past_key_values.values, ref.past_key_values.values):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert [p.data_ptr() for p in model.parameters()] == params
    left = [m for m in model.modules() if getattr(m, "qkv", None) is not None or getattr(m, "gate_up", None) is not None]
    assert left == []  # dropped on exit


def test_lora_layers_fuse_only_with_their_adapters_merged() -> None:
    """Active adapters keep the separate projections; inside `merged_adapters` (the rollout worker's
    decode) the merged base weights are fused, and give the adapted model's function."""
    from dllm_models import apply_lora
    from dllm_models.lora import merged_adapters

    model = apply_lora(build_tiny("sdar").double(), rank=4, alpha=8).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)  # adapters that change the function
    ids, attn = _inputs(model)
    with torch.no_grad():
        ref = model(ids, attention_mask=attn).logits
        with fused_projections(model) as n:
            got = model(ids, attention_mask=attn).logits
        assert n == 0  # every Qwen projection is adapted here: none fused while the adapters run
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
        with merged_adapters(model):
            merged = model(ids, attention_mask=attn).logits
            with fused_projections(model) as n:
                fused = model(ids, attention_mask=attn).logits
        assert n == FAMILIES["sdar"]
    torch.testing.assert_close(fused, merged, rtol=0, atol=1e-12)
    torch.testing.assert_close(merged, ref, rtol=0, atol=1e-5)  # the merge adds the delta in float32


@pytest.mark.parametrize("family", ["sdar", "Dream"])
def test_decoding_with_fused_projections_gives_the_same_samples(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_models.fusion as fusion
    from dllm_rollout import generate

    model = build_tiny(family).double()
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [20, 21, 22, 23, 24, 25, 26]]
    settings: dict[str, object] = {"max_new_tokens": 8, "steps": 8 if family == "Dream" else 4, "seed": 2,
                                   "temperature": 1.0, "top_k": 10, "cache": "prefix", "record_trajectory": True}
    if family == "sdar":
        settings["block_length"] = 4
    else:
        settings.update(block_length=4, cache="dual")
    entered: list[int] = []
    real = fusion.fused_projections

    @contextmanager
    def spy(m: torch.nn.Module) -> Iterator[int]:
        with real(m) as n:
            entered.append(n)
            yield n

    monkeypatch.setattr(fusion, "fused_projections", spy)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(fusion, "FUSED_PROJECTIONS", on)
        out[on] = generate(model, prompts, **settings)  # type: ignore[arg-type]
    assert entered == [FAMILIES[family]]  # the fused decode ran with every layer fused
    assert torch.equal(out[False].response_ids, out[True].response_ids)
    assert out[False].step_logp is not None and out[True].step_logp is not None
    torch.testing.assert_close(out[False].step_logp, out[True].step_logp, rtol=0, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fused_projections_on_gpu(family: str) -> None:
    """The fused GEMMs with the GPU's kernels (the rope kernel reads q and k through head strides)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = build_tiny(family).cuda().eval()
    ids, attn = (t.cuda() for t in _inputs(model))
    with torch.no_grad():
        ref = model(ids, attention_mask=attn).logits
        with fused_projections(model) as n:
            assert n == FAMILIES[family]
            got = model(ids, attention_mask=attn).logits
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)

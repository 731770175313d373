"""`merged_adapters`: decoding from adapters folded into the weights, the base restored bit for bit."""

from __future__ import annotations

import pytest
import torch

from dllm_models import apply_lora, has_adapters, merged_adapters
from dllm_models.lora import lora_parameter_names
from dllm_rollout import generate
from tests.dllm_models.tiny_configs import build_tiny

pytest.importorskip("peft")


def _lora(family: str) -> torch.nn.Module:
    model = apply_lora(build_tiny(family), rank=4, alpha=8)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: give the adapters something to add
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_merged_forward_equals_unmerged_and_restores_the_base(family: str) -> None:
    model = _lora(family)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    trainable = lora_parameter_names(model)
    unmerged = model(ids).logits
    with merged_adapters(model):
        merged = model(ids).logits
        changed = [n for n, p in model.named_parameters() if "lora_" not in n and not torch.equal(p, base[n])]
    assert changed, "the adapters were not folded in"
    torch.testing.assert_close(merged, unmerged, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)
    assert lora_parameter_names(model) == trainable
    torch.testing.assert_close(model(ids).logits, unmerged, rtol=0, atol=0)


def test_merged_decode_gives_the_unmerged_tokens() -> None:
    model = _lora("sdar")
    kw = dict(max_new_tokens=8, steps=4, block_length=model.traits.block_length, temperature=0.0, cache="prefix",
              seed=0)
    unmerged = generate(model, [[5, 6, 7], [8, 9]], **kw).response_ids  # type: ignore[arg-type]
    with merged_adapters(model):
        merged = generate(model, [[5, 6, 7], [8, 9]], **kw).response_ids  # type: ignore[arg-type]
    assert torch.equal(merged, unmerged)


def test_a_model_without_adapters_runs_as_is() -> None:
    model = build_tiny("sdar")
    assert not has_adapters(model)
    with merged_adapters(model) as same:
        assert same is model


def test_the_base_is_restored_when_the_block_raises() -> None:
    model = _lora("sdar")
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    with pytest.raises(RuntimeError, match="boom"), merged_adapters(model):
        raise RuntimeError("boom")
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)

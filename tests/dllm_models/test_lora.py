"""LoRA through peft: adapters only are trainable, adapter-only state, merge keeps the logits."""

from __future__ import annotations

import re

import pytest
import torch

from dllm_models import FAMILY_NAMES, FAMILIES
from dllm_models.lora import DEFAULT_TARGETS, default_target_modules
from tests.dllm_models.tiny_configs import TINY_CONFIGS, build_tiny


def test_default_llada_targets_exclude_the_lm_head(tiny_llada: torch.nn.Module) -> None:
    pattern = re.compile(default_target_modules(tiny_llada))
    hit = sorted({n.rsplit(".", 1)[-1] for n, _ in tiny_llada.named_modules() if pattern.fullmatch(n)})
    assert hit == ["attn_out", "ff_out", "ff_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
    assert not pattern.fullmatch("model.transformer.ff_out")
    assert pattern.fullmatch("model.transformer.blocks.1.ff_out")


def test_default_targets_of_other_layouts() -> None:
    qwen = re.compile(DEFAULT_TARGETS["sdar"])
    assert qwen.fullmatch("model.layers.3.self_attn.o_proj") and qwen.fullmatch("model.layers.0.mlp.down_proj")
    assert not qwen.fullmatch("lm_head") and not qwen.fullmatch("model.layers.0.self_attn.q_norm")
    l2 = re.compile(DEFAULT_TARGETS["llada2"])
    for name in (
        "model.layers.0.attention.query_key_value", "model.layers.5.attention.dense",
        "model.layers.0.mlp.gate_proj", "model.layers.2.mlp.experts.17.up_proj",
        "model.layers.2.mlp.shared_experts.down_proj",
    ):
        assert l2.fullmatch(name), name
    assert not l2.fullmatch("model.layers.2.mlp.gate") and not l2.fullmatch("lm_head")


def test_every_family_has_default_targets_from_the_registry() -> None:
    assert set(DEFAULT_TARGETS) == set(FAMILY_NAMES)
    assert all(DEFAULT_TARGETS[name] == fam.lora_targets for name, fam in FAMILIES.items())


# every family's tiny model (config.json `model_type` keys) and the modules its default targets hit
_HITS = {
    "Dream": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "sdar": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "sdar_moe": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "llada2_moe": {"query_key_value", "dense", "gate_proj", "up_proj", "down_proj"},
}


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_lora_applies_trains_and_merges_on_every_family(model_type: str) -> None:
    pytest.importorskip("peft")
    from dllm_models.lora import apply_lora, merge_lora

    model = build_tiny(model_type)
    assert getattr(model, "traits").family in FAMILY_NAMES  # the canonical name, not the model_type
    base = set(model.state_dict())
    pattern = re.compile(default_target_modules(model))
    hit = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if pattern.fullmatch(n)}
    assert hit == _HITS[model_type]
    model = apply_lora(model, rank=2, alpha=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n or "embed" in n for n in trainable)
    ids = torch.randint(0, 60, (2, 8), generator=torch.Generator().manual_seed(0))
    model.train()
    model(ids).logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_A" in n and ".experts." not in n)
    model.eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # B starts at zero: move it so the merge has something to fold in
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.1)
        ref = model(ids).logits
        merged = merge_lora(model)
        assert set(merged.state_dict()) == base
        # W + s B A folded in float32: 1e-5-scale rounding on logits of size ~5 (the adapters move them ~0.1)
        torch.testing.assert_close(merged(ids).logits, ref, rtol=1e-4, atol=1e-4)


def test_unknown_family_is_a_clear_error() -> None:
    class NoTraits(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match="no default LoRA target modules"):
        default_target_modules(NoTraits())


def test_adapters_train_alone_and_merge_keeps_logits(tiny_llada: torch.nn.Module) -> None:
    pytest.importorskip("peft")
    from dllm_models.lora import adapter_state_dict, apply_lora, merge_lora

    base = {k: v.clone() for k, v in tiny_llada.state_dict().items()}
    model = apply_lora(tiny_llada, rank=4, alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any(n.startswith("model.transformer.ff_out") for n in trainable)  # LM head untouched
    adapters = {k: v.clone() for k, v in adapter_state_dict(model).items()}
    assert set(adapters) == set(trainable) and len(adapters) == 2 * 7 * 2  # 2 layers x 7 modules x A, B

    ids = torch.randint(0, 48, (2, 7), generator=torch.Generator().manual_seed(1))
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loss = model(ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    after = model.state_dict()
    for k, v in base.items():
        peft_name = k.replace(".weight", ".base_layer.weight") if k not in after else k
        torch.testing.assert_close(after[peft_name], v, rtol=0, atol=0)
    changed = [k for k, v in adapter_state_dict(model).items() if not torch.equal(v, adapters[k])]
    assert any("lora_B" in k for k in changed)  # B starts at zero and must move

    model.eval()
    with torch.no_grad():
        ref = model(ids).logits
        merged = merge_lora(model)
        assert not any("lora_" in k for k in merged.state_dict())
        assert set(merged.state_dict()) == set(base)
        torch.testing.assert_close(merged(ids).logits, ref, rtol=1e-5, atol=1e-5)

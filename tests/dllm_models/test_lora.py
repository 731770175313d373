"""LoRA through peft: adapters only are trainable, adapter-only state, merge keeps the logits."""

from __future__ import annotations

import re

import pytest
import torch

from dllm_models.lora import DEFAULT_TARGETS, default_target_modules


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
    l2 = re.compile(DEFAULT_TARGETS["llada2_moe"])
    for name in (
        "model.layers.0.attention.query_key_value", "model.layers.5.attention.dense",
        "model.layers.0.mlp.gate_proj", "model.layers.2.mlp.experts.17.up_proj",
        "model.layers.2.mlp.shared_experts.down_proj",
    ):
        assert l2.fullmatch(name), name
    assert not l2.fullmatch("model.layers.2.mlp.gate") and not l2.fullmatch("lm_head")


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

"""LoRA adapters on their own: PEFT's folder layout, read back by peft itself and by load_peft_adapter."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tests.dllm_models.tiny_configs import build_tiny

pytest.importorskip("peft")


def _trained_adapter(family: str = "llada") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(base, the base with rank-2 adapters whose B is non-zero): B starts at zero, so set it."""
    from dllm_models.lora import apply_lora

    torch.manual_seed(0)
    base = build_tiny(family).eval()
    model = apply_lora(copy.deepcopy(base), rank=2, alpha=4)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return base, model.eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 48, (2, 7), generator=torch.Generator().manual_seed(1))


def test_layout_is_peft_s(tmp_path: Path) -> None:
    from safetensors import safe_open

    from dllm_models.lora import PEFT_CONFIG, PEFT_WEIGHTS, adapter_state_dict, save_peft_adapter

    _, model = _trained_adapter()
    save_peft_adapter(model, tmp_path, base_model="/models/base")
    config = json.loads((tmp_path / PEFT_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 2 and config["lora_alpha"] == 4
    assert config["base_model_name_or_path"] == "/models/base" and config["inference_mode"] is True
    assert config["target_modules"] == model.peft_config["default"].target_modules
    with safe_open(str(tmp_path / PEFT_WEIGHTS), "pt") as f:
        keys = set(f.keys())
    # PeftModel's names: base_model.model.<module path>.lora_A.weight, no adapter name inside
    ours = {k.replace(".default.", ".") for k in adapter_state_dict(model)}
    assert keys == {f"base_model.model.{k}" for k in ours} and len(keys) == 2 * 7 * 2


def test_peft_reads_it_and_gives_the_merged_logits(tmp_path: Path) -> None:
    import peft

    from dllm_models.lora import merge_lora, save_peft_adapter

    base, model = _trained_adapter()
    save_peft_adapter(model, tmp_path)
    with torch.no_grad():
        merged = merge_lora(copy.deepcopy(model))(_ids()).logits
        loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path)).eval()
        torch.testing.assert_close(loaded(_ids()).logits, merged, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(base(_ids()).logits, merged, atol=1e-3)  # the adapter does something


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_load_peft_adapter_on_the_base_equals_the_merged_model(tmp_path: Path, family: str) -> None:
    from dllm_models.lora import load_peft_adapter, merge_lora, save_peft_adapter

    base, model = _trained_adapter(family)
    save_peft_adapter(model, tmp_path)
    with torch.no_grad():
        merged = merge_lora(copy.deepcopy(model))(_ids()).logits
        for merge in (True, False):
            applied = load_peft_adapter(copy.deepcopy(base), tmp_path, merge=merge)
            torch.testing.assert_close(applied(_ids()).logits, merged, rtol=1e-5, atol=1e-5)


def test_bad_adapter_folders_are_one_clear_error(tmp_path: Path) -> None:
    from dllm_models.lora import PEFT_CONFIG, check_peft_adapter, load_peft_adapter, save_peft_adapter

    with pytest.raises(ValueError, match="lacks adapter_config.json, adapter_model.safetensors"):
        check_peft_adapter(tmp_path)
    _, model = _trained_adapter("llada")
    save_peft_adapter(model, tmp_path / "llada")
    with pytest.raises(ValueError, match="does not fit this model|matched no module|Target modules"):
        load_peft_adapter(build_tiny("sdar"), tmp_path / "llada")
    (tmp_path / "llada" / PEFT_CONFIG).write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        check_peft_adapter(tmp_path / "llada")

"""LoRA adapters on any family through peft (optional extra `lora`, imported lazily).

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv 2106.09685. Adapters are
injected in place (`peft.inject_adapter_in_model`), so the model keeps its class, `traits` and
forward signature; only adapter weights are trainable afterwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dllm_models.registry import FAMILIES, MODEL_TYPES

# Default target modules per canonical family name (`traits.family`): the registry's entries.
DEFAULT_TARGETS: dict[str, str] = {name: fam.lora_targets for name, fam in FAMILIES.items()}

_ADAPTER_MARK = "lora_"


def _peft() -> Any:
    try:
        import peft  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError as err:
        raise ImportError(
            "LoRA needs peft: install the extra with `uv sync --extra lora` (dllm-models[lora])"
        ) from err
    return peft


def default_target_modules(model: nn.Module) -> str:
    """The default LoRA target regex of the model's family (`model.traits.family`, see
    `dllm_models.registry.FAMILIES`; a config.json `model_type` spelling is accepted too)."""
    traits = getattr(model, "traits", None)
    family = str(getattr(traits, "family", None))
    name = family if family in DEFAULT_TARGETS else MODEL_TYPES.get(family)
    if name is None:
        raise ValueError(
            f"no default LoRA target modules for family {family!r}; pass target_modules= "
            f"(names or a regex) or use a model of one of {sorted(DEFAULT_TARGETS)}"
        )
    return DEFAULT_TARGETS[name]


def apply_lora(
    model: nn.Module,
    *,
    rank: int = 16,
    alpha: float = 32,
    dropout: float = 0.0,
    target_modules: str | list[str] | None = None,
    adapter_name: str = "default",
) -> nn.Module:
    """Inject LoRA adapters into `model` in place and freeze every other parameter.

    Args:
        model: a family module.
        rank, alpha, dropout: LoRA rank r, scaling numerator (scale = alpha / r) and dropout.
        target_modules: module-name suffixes or a full-match regex; None: the family default
            (`DEFAULT_TARGETS`).
        adapter_name: peft adapter name.

    Returns:
        The same module, with `lora_A`/`lora_B` weights as its only trainable parameters.
    """
    if rank < 1 or alpha <= 0 or not 0.0 <= dropout < 1.0:
        raise ValueError(f"need rank >= 1, alpha > 0, 0 <= dropout < 1; got {rank}, {alpha}, {dropout}")
    peft = _peft()
    targets = default_target_modules(model) if target_modules is None else target_modules
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none"
    )
    model = peft.inject_adapter_in_model(config, model, adapter_name=adapter_name)
    n = 0
    for name, p in model.named_parameters():
        is_adapter = _ADAPTER_MARK in name
        p.requires_grad_(is_adapter)
        n += int(is_adapter)
    if n == 0:
        raise ValueError(f"target_modules {targets!r} matched no module of {type(model).__name__}")
    return model


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter weights (`...lora_A.<adapter>.weight`, `...lora_B...`): detached views
    sharing storage with the model (clone them to keep a snapshot)."""
    return {k: v.detach() for k, v in model.state_dict().items() if _ADAPTER_MARK in k}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W += scale * B A) and remove the LoRA layers.

    Returns the same module with plain layers again (all parameters left frozen).
    """
    tuner = _peft().tuners.tuners_utils.BaseTunerLayer
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, tuner)]
    for name, module in targets:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if hasattr(model, attr):
            delattr(model, attr)
    return model


PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."  # what `peft.PeftModel` puts before the wrapped model's names


def save_peft_adapter(model: nn.Module, folder: str | Path, *, adapter_name: str = "default",
                      base_model: str | None = None) -> Path:
    """Write the adapters of `model` (`apply_lora`) in PEFT's format, which
    `peft.PeftModel.from_pretrained(base, folder)` and `load_peft_adapter` read.

    Args:
        model: a family module carrying LoRA adapters.
        folder: the adapter folder to write (`adapter_config.json`, `adapter_model.safetensors`).
        adapter_name: the peft adapter to save.
        base_model: recorded as `base_model_name_or_path` (the base checkpoint folder).

    Returns:
        `folder`.
    """
    peft = _peft()
    from safetensors.torch import save_file

    configs = getattr(model, "peft_config", {})
    if adapter_name not in configs:
        raise ValueError(f"the model carries no LoRA adapter {adapter_name!r} to save (apply_lora first)")
    config = configs[adapter_name]
    state = peft.get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    saved = peft.LoraConfig(**{**config.to_dict(), "base_model_name_or_path": base_model, "inference_mode": True})
    saved.save_pretrained(str(out))
    tensors = {f"{_PEFT_PREFIX}{k}": v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(out / PEFT_WEIGHTS), metadata={"format": "pt"})
    return out


def check_peft_adapter(folder: str | Path) -> dict[str, Any]:
    """Raise `ValueError` unless `folder` holds a PEFT LoRA adapter; return its config (read from
    `adapter_config.json` alone: no weights are loaded and peft is not needed)."""
    root = Path(folder)
    missing = [n for n in (PEFT_CONFIG, PEFT_WEIGHTS) if not (root / n).is_file()]
    if missing:
        raise ValueError(f"adapter folder {str(root)!r} lacks {', '.join(missing)}: pass the adapter/ folder "
                         "of a LoRA run (or a folder written by peft's save_pretrained)")
    try:
        config = json.loads((root / PEFT_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{root / PEFT_CONFIG} cannot be read: {err}") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else None
        raise ValueError(f"{root / PEFT_CONFIG} is not a LoRA adapter (peft_type {kind!r}); only LoRA is supported")
    return config


def load_peft_adapter(model: nn.Module, folder: str | Path, *, merge: bool = True) -> nn.Module:
    """Apply the PEFT LoRA adapter in `folder` to `model` (its base), in place.

    Args:
        model: the base family module the adapter was trained on.
        folder: a folder of `save_peft_adapter` or peft's `save_pretrained`.
        merge: fold the adapter into the base weights (`merge_lora`), so decoding costs what the
            base model costs; False keeps the LoRA layers.

    Returns:
        The same module with the adapter applied.
    """
    check_peft_adapter(folder)
    peft = _peft()
    from safetensors.torch import load_file

    root = Path(folder)
    config = peft.LoraConfig.from_pretrained(str(root))
    model = peft.inject_adapter_in_model(config, model, adapter_name="default")
    state = {k.removeprefix(_PEFT_PREFIX): v for k, v in load_file(str(root / PEFT_WEIGHTS)).items()}
    wanted = set(peft.get_peft_model_state_dict(model, adapter_name="default", save_embedding_layers=False))
    if set(state) != wanted:
        extra, absent = sorted(set(state) - wanted)[:3], sorted(wanted - set(state))[:3]
        raise ValueError(f"adapter {str(root)!r} does not fit this model: keys not in the model {extra}, "
                         f"model keys not in the adapter {absent}; pass the base checkpoint it was trained on")
    try:
        peft.set_peft_model_state_dict(model, state, adapter_name="default")
    except RuntimeError as err:  # a tensor of another shape: another base model
        raise ValueError(f"adapter {str(root)!r} does not fit this model ({str(err).splitlines()[-1].strip()}); "
                         "pass the base checkpoint it was trained on") from None
    for p in model.parameters():
        p.requires_grad_(False)
    return merge_lora(model) if merge else model


def lora_parameter_names(model: nn.Module) -> list[str]:
    """Names of the trainable adapter parameters."""
    return [n for n, p in model.named_parameters() if p.requires_grad and re.search(_ADAPTER_MARK, n)]


def has_adapters(model: nn.Module) -> bool:
    """Whether `model` carries LoRA adapters (`apply_lora`)."""
    return any(_ADAPTER_MARK in n for n, _ in model.named_parameters())


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` as its base weights: every LoRA adapter off inside the block, on again after.

    The reference model of a LoRA run is exactly this (the frozen base), so it needs no copy.
    """
    tuner = _peft().tuners.tuners_utils.BaseTunerLayer
    layers = [m for m in model.modules() if isinstance(m, tuner)]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
        for n, p in model.named_parameters():  # peft re-enables adapters as trainable: keep what was
            p.requires_grad_(n in trainable)


@contextmanager
def merged_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` with every active adapter folded into its base weight, restored exactly after.

    Decoding calls the model hundreds of times per rollout; unmerged adapters add two small
    matmuls per target module and call. Inside the block each base weight holds W + scale * B A
    (computed in float32, cast to W's dtype) and the adapters are off, so a forward costs what a
    plain model costs. The base weights are copied first and copied back on exit, so the frozen
    base is bit-for-bit unchanged (an in-place `W -= scale * B A` would not be, in bf16). The copies
    take the size of the targeted weights while the block runs. A model without adapters runs as is.

    The base weights must not be read as the frozen reference inside the block
    (`BaseWeightsView` of the same model): the rollout worker keeps the adapters unmerged then.
    """
    if not has_adapters(model):
        yield model
        return
    tuner = _peft().tuners.tuners_utils.BaseTunerLayer
    layers = [m for m in model.modules() if isinstance(m, tuner)]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for m in layers:
                weight = m.get_base_layer().weight
                saved.append((weight, weight.detach().clone()))
                delta = sum((m.get_delta_weight(a).float() for a in m.active_adapters), torch.zeros(()))
                weight.copy_((weight.float() + delta).to(weight.dtype))
                m.enable_adapters(False)
        yield model
    finally:
        with torch.no_grad():
            for weight, copy in saved:
                weight.copy_(copy)
        for m in layers:
            m.enable_adapters(True)
        for n, p in model.named_parameters():
            p.requires_grad_(n in trainable)


class BaseWeightsView:
    """A LoRA model's base weights, called like a model, with no copy: every call runs the
    wrapped model inside `adapters_disabled`.

    Serves where a frozen initial policy is read as a model (reference log-probs scored during a
    rollout): with LoRA the base weights never train, so they are the initial policy while the
    adapters start at zero (peft's default). `traits` and the output head are the wrapped model's,
    and every keyword (`logit_columns=`, `attention_backend=`) reaches the wrapped forward, so
    decoders that restrict the head to some columns work on the view. It owns no parameters and no module state (`eval()`/`train()` stay the model's).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def traits(self) -> Any:
        return self.model.traits

    def get_output_embeddings(self) -> nn.Module:
        from dllm_models.logprob import output_head

        return output_head(self.model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_disabled(self.model):
            return self.model(*args, **kwargs)

"""Plain-dict registry of model families: one canonical name per family, its kind, its
config.json `model_type` spellings, its modules and its default LoRA targets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from dllm_models.families.dream import DreamConfig, DreamModel
from dllm_models.families.llada import LLaDAConfig, LLaDAModel
from dllm_models.families.llada2 import LLaDA2Config, LLaDA2Model
from dllm_models.families.sdar import SDARConfig, SDARModel
from dllm_models.families.sdar_moe import SDARMoeConfig, SDARMoeModel


class FamilyConfig(Protocol):
    """What a family's config dataclass offers."""

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> Any: ...

    def to_hf(self) -> dict[str, Any]: ...


# Default LoRA target modules, as regexes over module names that peft matches in full. LLaDA's
# block `ff_out` is the down projection; `model.transformer.ff_out` is the LM head and is excluded
# by requiring the `blocks.<i>.` prefix. Qwen-layout families (Dream, SDAR) share one pattern; the
# MoE layouts add the expert index (and LLaDA2 its shared experts).
_QWEN_TARGETS = r".*\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"
_LORA_TARGETS = {
    "llada": r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)",
    "dream": _QWEN_TARGETS,
    "sdar": _QWEN_TARGETS,
    "sdar_moe": _QWEN_TARGETS.replace(r"mlp\.(gate_proj", r"mlp\.(experts\.\d+\.)?(gate_proj"),
    "llada2": (
        r".*\.layers\.\d+\.(attention\.(query_key_value|dense)"
        r"|mlp\.(shared_experts\.)?(experts\.\d+\.)?(gate_proj|up_proj|down_proj))"
    ),
}

KINDS = ("masked", "block")


@dataclass(frozen=True)
class Family:
    """A model family: its one canonical name, its kind, its config.json spellings, its modules.

    Attributes:
        name: canonical family name ('llada', 'dream', 'sdar', 'sdar_moe', 'llada2'); what
            `model.traits.family` reports and what recipes and algorithm tables use.
        kind: 'masked' (bidirectional masked diffusion) or 'block' (block diffusion).
        model_types: the config.json `model_type` values of the family's releases.
        config_cls: the family's config dataclass (`from_hf` / `to_hf`).
        model_cls: the module class.
        lora_targets: default LoRA target modules (a full-match regex over module names).
    """

    name: str
    kind: str
    model_types: tuple[str, ...]
    config_cls: Any
    model_cls: type[nn.Module]
    lora_targets: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"family {self.name!r}: kind {self.kind!r} must be one of {KINDS}")


def _family(name: str, kind: str, model_types: tuple[str, ...], config_cls: Any, model_cls: type[nn.Module]) -> Family:
    return Family(name, kind, model_types, config_cls, model_cls, _LORA_TARGETS[name])


# Keyed by canonical name; `MODEL_TYPES` maps every config.json `model_type` to it.
FAMILIES: dict[str, Family] = {
    "llada": _family("llada", "masked", ("llada",), LLaDAConfig, LLaDAModel),
    "dream": _family("dream", "masked", ("Dream",), DreamConfig, DreamModel),
    "sdar": _family("sdar", "block", ("sdar",), SDARConfig, SDARModel),
    "sdar_moe": _family("sdar_moe", "block", ("sdar_moe",), SDARMoeConfig, SDARMoeModel),
    "llada2": _family("llada2", "block", ("llada2_moe",), LLaDA2Config, LLaDA2Model),
}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
MODEL_TYPES: dict[str, str] = {t: fam.name for fam in FAMILIES.values() for t in fam.model_types}


def get_family(name: str) -> Family:
    """The registry entry of a family, by canonical name or by a config.json `model_type`.

    Raises:
        ValueError: naming the unknown value and the valid names.
    """
    fam = FAMILIES.get(name) or FAMILIES.get(MODEL_TYPES.get(name, ""))
    if fam is None:
        raise ValueError(
            f"model family {name!r} is unknown; choose one of {list(FAMILY_NAMES)} "
            f"(config.json model_type one of {sorted(MODEL_TYPES)})"
        )
    return fam


def family_kind(name: str) -> str:
    """'masked' or 'block': the kind of a family given by canonical name or `model_type`."""
    return get_family(name).kind


def family_names(kind: str | None = None) -> tuple[str, ...]:
    """Canonical family names, all or those of one kind ('masked' or 'block'), registry order."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"family kind {kind!r} is unknown; choose one of {KINDS}")
    return tuple(n for n, f in FAMILIES.items() if kind is None or f.kind == kind)


def family_for(raw_config: dict[str, Any]) -> Family:
    """The family of a config.json dict, by its `model_type`."""
    model_type = raw_config.get("model_type")
    name = MODEL_TYPES.get(str(model_type))
    if name is None:
        raise ValueError(
            f"config.json model_type {model_type!r} is not a known family; "
            f"known: {sorted(MODEL_TYPES)}"
        )
    return FAMILIES[name]


def build_model(raw_config: dict[str, Any]) -> nn.Module:
    """Build the family's module from a config.json dict (weights uninitialised by contract)."""
    fam = family_for(raw_config)
    return fam.model_cls(fam.config_cls.from_hf(raw_config))


def empty_model(raw_config: dict[str, Any], *, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """`build_model` with uninitialised `dtype` parameters allocated on `device`.

    Built on the meta device under `dtype` as the default dtype, so a large model never exists
    in float32 or on the CPU on the way; fill the parameters afterwards (`reset_parameters`,
    a checkpoint).
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = build_model(raw_config)
    finally:
        torch.set_default_dtype(previous)
    return model.to_empty(device=device)

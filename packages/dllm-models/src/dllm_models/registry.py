"""Plain-dict registry of model families, keyed by config.json `model_type`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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


@dataclass(frozen=True)
class Family:
    """A model family: how to read its config and which module builds it."""

    name: str
    config_cls: Any
    model_cls: type[nn.Module]


FAMILIES: dict[str, Family] = {
    "llada": Family("llada", LLaDAConfig, LLaDAModel),
    "Dream": Family("Dream", DreamConfig, DreamModel),
    "sdar": Family("sdar", SDARConfig, SDARModel),
    "sdar_moe": Family("sdar_moe", SDARMoeConfig, SDARMoeModel),
    "llada2_moe": Family("llada2_moe", LLaDA2Config, LLaDA2Model),
}


def family_for(raw_config: dict[str, Any]) -> Family:
    """The family of a config.json dict, by its `model_type`."""
    model_type = raw_config.get("model_type")
    fam = FAMILIES.get(str(model_type))
    if fam is None:
        raise ValueError(
            f"config.json model_type {model_type!r} is not a known family; "
            f"known: {sorted(FAMILIES)}"
        )
    return fam


def build_model(raw_config: dict[str, Any]) -> nn.Module:
    """Build the family's module from a config.json dict (weights uninitialised by contract)."""
    fam = family_for(raw_config)
    return fam.model_cls(fam.config_cls.from_hf(raw_config))

"""The registry of algorithm names: plain dicts from name to a configured algorithm object.

The algorithms themselves live in `dllm_algorithms` (typed classes that `dllm_train` runs); the
app names them, gives them their reference defaults and checks them against a model's family.
"""

from __future__ import annotations

import re
from typing import Any

from dllm_algorithms import (
    ALL_FAMILIES,
    BGPO,
    BLOCK,
    CJGRPO,
    D1,
    DMPO,
    DPO,
    EBPO,
    ESPO,
    MASKED,
    MDPO,
    SFT,
    SPG,
    VRPO,
    BridgeRatioGRPO,
    CoupledGRPO,
    DTreeRPO,
    JustGRPO,
    LoRA,
)
from dllm_train import RLAlgorithm

ALGORITHMS: dict[str, RLAlgorithm[Any]] = {
    "d1": D1(),
    "coupled-grpo": CoupledGRPO(),
    "bridgeratio-grpo": BridgeRatioGRPO(),
    "justgrpo": JustGRPO(),
    "bgpo": BGPO(),
    "espo": ESPO(),
    "ebpo": EBPO(),
    "spg": SPG(),
    "cj-grpo": CJGRPO(),
    "mdpo": MDPO(),
    "d-treerpo": DTreeRPO(),
    "dmpo": DMPO(),
}
"""RL algorithms with their reference defaults."""

PAPERS: dict[str, str] = {
    "d1": "Zhao et al., arXiv 2504.12216", "coupled-grpo": "DiffuCoder, arXiv 2506.20639",
    "justgrpo": "Ni et al., arXiv 2601.15165", "bgpo": "Lin et al., arXiv 2510.11683",
    "espo": "Ou et al., arXiv 2512.03759", "ebpo": "LLaDA2.1, arXiv 2602.08676", "spg": "Wang et al., arXiv 2510.09541",
    "cj-grpo": "Yang et al., arXiv 2509.23924", "mdpo": "He et al., arXiv 2508.13148",
    "d-treerpo": "Pan et al., arXiv 2512.09675", "dmpo": "Zhu et al., arXiv 2510.08233",
    "bridgeratio-grpo": "CURE-RLVR, DARE PR #21 (yjyddq/DARE 6d4791f)",
    "dpo": "Rafailov et al., arXiv 2305.18290", "vrpo": "LLaDA 1.5, arXiv 2505.19223",
    "sft": "LLaDA, arXiv 2502.09992", "lora-sft": "Hu et al., arXiv 2106.09685",
}
"""The paper behind each registry name (for `dare recipes`)."""

PREFERENCE_ALGORITHMS: dict[str, DPO | VRPO] = {"dpo": DPO(), "vrpo": VRPO()}

SFT_ALGORITHMS: dict[str, SFT] = {
    "sft": SFT(),
    "lora-sft": SFT(lora=LoRA()),
}


def get_algorithm(name: str) -> RLAlgorithm[Any]:
    """The registry entry of RL algorithm `name`."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is unknown; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def family_key(model: Any) -> str:
    """The canonical family name of a model ('llada', 'dream', 'sdar', 'sdar_moe', 'llada2')."""
    from dllm_models import get_family

    return get_family(str(model.traits.family)).name


def check_family(name: str, entry: Any, family: str) -> None:
    """Raise if algorithm `name` is not defined for model family `family`."""
    if family not in entry.families:
        raise ValueError(f"algorithm {name!r} is defined for families {list(entry.families)}, not {family!r}")


def describe() -> dict[str, Any]:
    """name -> the first sentence of the algorithm's docstring."""
    out: dict[str, Any] = {}
    for table in (ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS):
        for name, entry in table.items():
            paragraph = " ".join((type(entry).__doc__ or "").strip().split("\n\n")[0].split())
            out[name] = re.split(r"\.\s+(?=[A-Z])", paragraph)[0].rstrip(".") + "."
    return out


__all__ = [
    "ALGORITHMS", "ALL_FAMILIES", "BLOCK", "MASKED", "PAPERS", "PREFERENCE_ALGORITHMS", "SFT_ALGORITHMS", "LoRA",
    "check_family", "describe", "family_key", "get_algorithm",
]

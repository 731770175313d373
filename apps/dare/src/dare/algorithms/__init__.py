"""Algorithms as data: plain dicts from name to a frozen dataclass of hyper-parameters.

RL algorithms build a `dllm_train.PolicyObjective`; preference algorithms a
`dllm_train.PreferenceObjective`; SFT entries configure an `SFTWorker`. Modules group
algorithms by idea: `token_policy` (per-token likelihoods), `elbo_policy` (sequence ELBOs),
`trajectory_policy` (replayed denoising paths), `distribution_matching`, `preference`, `sft`.
"""

from __future__ import annotations

from typing import Any

from dllm_train import PolicyObjective, PreferenceObjective, RLConfig

from dare.algorithms.common import ALL_FAMILIES, BLOCK, MASKED, Algorithm
from dare.algorithms.distribution_matching import DMPO
from dare.algorithms.elbo_policy import BGPO, EBPO, ESPO, SPG
from dare.algorithms.preference import DPO, VRPO
from dare.algorithms.sft import SFT, LoRA
from dare.algorithms.token_policy import D1, CoupledGRPO, JustGRPO
from dare.algorithms.trajectory_policy import MDPO, CJGRPO, DTreeRPO

ALGORITHMS: dict[str, Algorithm] = {
    "d1": D1(),
    "coupled-grpo": CoupledGRPO(),
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
"""RL algorithms (reference defaults, spec §6)."""

PREFERENCE_ALGORITHMS: dict[str, DPO | VRPO] = {"dpo": DPO(), "vrpo": VRPO()}

SFT_ALGORITHMS: dict[str, SFT] = {
    "sft": SFT(),
    "lora-sft": SFT(lora=LoRA()),
}


def get_algorithm(name: str) -> Algorithm:
    """The registry entry of RL algorithm `name`."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is unknown; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


def build_objective(name: str, rl: RLConfig, algorithm: Algorithm | None = None) -> PolicyObjective:
    """The PolicyObjective of algorithm `name` (or of `algorithm`, a customised entry)."""
    return (algorithm or get_algorithm(name)).build(rl)


def build_preference(name: str) -> PreferenceObjective:
    if name not in PREFERENCE_ALGORITHMS:
        raise ValueError(f"preference algorithm {name!r} is unknown; choose one of {sorted(PREFERENCE_ALGORITHMS)}")
    return PREFERENCE_ALGORITHMS[name].build()


def family_key(model: Any) -> str:
    """The registry family name of a model ('llada', 'dream', 'sdar', 'sdar_moe', 'llada2')."""
    family = str(getattr(model.traits, "family", "")).lower()
    return "llada2" if family.startswith("llada2") else family


def check_family(name: str, entry: Any, family: str) -> None:
    """Raise if algorithm `name` is not defined for model family `family`."""
    if family not in entry.families:
        raise ValueError(f"algorithm {name!r} is defined for families {list(entry.families)}, not {family!r}")


def describe() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in (ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS):
        for name, entry in table.items():
            out[name] = (type(entry).__doc__ or "").strip().splitlines()[0]
    return out


__all__ = [
    "ALGORITHMS", "ALL_FAMILIES", "BLOCK", "MASKED", "PREFERENCE_ALGORITHMS", "SFT_ALGORITHMS", "Algorithm",
    "BGPO", "CJGRPO", "D1", "DMPO", "DPO", "EBPO", "ESPO", "MDPO", "SPG", "SFT", "VRPO", "CoupledGRPO",
    "DTreeRPO", "JustGRPO", "LoRA", "build_objective", "build_preference", "check_family", "describe",
    "family_key", "get_algorithm",
]

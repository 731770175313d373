"""The registry of algorithm names: plain dicts from name to a configured algorithm object.

The algorithms themselves live in `dllm_algorithms` (typed classes that `dllm_train` runs); the
app names them, gives them their reference defaults and checks them against a model's family. An
RL algorithm's entry (`RLEntry`, `dare.algorithms.builtin`) owns its recipe defaults, each with its
DARE source or the reason it differs, and its per-task settings; a user's package adds one with
`register(entry)` or the `dare.algorithms` entry-point group, without editing DARE.
"""

from __future__ import annotations

import re
from typing import Any

from dllm_algorithms import ALL_FAMILIES, BLOCK, DPO, MASKED, SFT, VRPO, LoRA
from dllm_train import RLAlgorithm

from dare.algorithms.entry import Default, RLEntry, TaskOverrides

RL_ENTRIES: dict[str, RLEntry] = {}
"""RL algorithm name -> its registry entry (the built-in ones, then `register` calls and plugins)."""

ALGORITHMS: dict[str, RLAlgorithm[Any]] = {}
"""RL algorithms with their reference defaults (name -> `RL_ENTRIES[name].algorithm`)."""

PAPERS: dict[str, str] = {
    "dpo": "Rafailov et al., arXiv 2305.18290", "vrpo": "LLaDA 1.5, arXiv 2505.19223",
    "sft": "LLaDA, arXiv 2502.09992", "lora-sft": "Hu et al., arXiv 2106.09685",
}
"""The paper behind each registry name (for `dare recipes`)."""

PLUGIN_GROUP = "dare.algorithms"
"""The entry-point group a package names its algorithms in: `[project.entry-points."dare.algorithms"]
my-grpo = "my_package:ENTRY"`, where ENTRY is an `RLEntry` (or a function returning one)."""

PREFERENCE_ALGORITHMS: dict[str, DPO | VRPO] = {"dpo": DPO(), "vrpo": VRPO()}

SFT_ALGORITHMS: dict[str, SFT] = {
    "sft": SFT(),
    "lora-sft": SFT(lora=LoRA()),
}


def register(entry: RLEntry, *, replace: bool = False) -> RLEntry:
    """Add an RL algorithm to the registry: `algorithm=NAME`, the recipes `<family>-NAME` and `dare show` see it.

    A user package calls this (or names the entry in the `dare.algorithms` entry-point group, which
    `dare` loads at start), so a new algorithm needs no edit of DARE (docs/algorithms.md#new-algorithm).

    Raises:
        ValueError: `entry.name` is taken (by any kind of algorithm) and `replace` is False.
    """
    if not isinstance(entry, RLEntry):
        raise TypeError(f"register() takes a dare.algorithms.RLEntry, got {type(entry).__name__}")
    taken = entry.name in RL_ENTRIES or entry.name in PREFERENCE_ALGORITHMS or entry.name in SFT_ALGORITHMS
    if taken and not (replace and entry.name in RL_ENTRIES):
        raise ValueError(f"algorithm name {entry.name!r} is already registered; choose another name "
                         "(or pass replace=True to replace an RL entry)")
    RL_ENTRIES[entry.name] = entry
    ALGORITHMS[entry.name] = entry.algorithm
    PAPERS[entry.name] = entry.paper
    return entry


PLUGIN_ERRORS: list[str] = []
"""One message per `dare.algorithms` entry point that failed to load (`dare` refuses to start with the first)."""


def _load_plugins() -> None:
    """Register every `dare.algorithms` entry point of the installed packages; a broken one is named in
    `PLUGIN_ERRORS` (which `dare` and the unknown-name errors print) instead of breaking the import."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP):
        try:
            loaded = point.load()
            entry = loaded() if callable(loaded) and not isinstance(loaded, RLEntry) else loaded
            if not isinstance(entry, RLEntry):
                raise TypeError(f"it gave {type(entry).__name__}, not a dare.algorithms.RLEntry")
            register(entry)
        except Exception as exc:  # a plugin's own failure, named once
            message = (f"the algorithm plugin {point.name!r} ({point.value}, entry-point group {PLUGIN_GROUP!r}) "
                       f"failed to load: {type(exc).__name__}: {exc}; fix or uninstall its package")
            PLUGIN_ERRORS.append(message)


def plugin_note() -> str:
    """'' or a note naming the plugins that failed to load (an unknown name may be theirs)."""
    return f" (note: {'; '.join(PLUGIN_ERRORS)})" if PLUGIN_ERRORS else ""


def get_algorithm(name: str) -> RLAlgorithm[Any]:
    """The registry entry of RL algorithm `name`."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is unknown; choose one of {sorted(ALGORITHMS)}{plugin_note()}")
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


def rl_entry(name: str) -> RLEntry:
    """The registry entry of RL algorithm `name` (its defaults and task settings included)."""
    get_algorithm(name)
    return RL_ENTRIES[name]


from dare.algorithms.builtin import BUILTIN  # noqa: E402  (the built-in entries import this module's names)
from dare.algorithms.tracerl import TRACERL, TRACERL_VALUE  # noqa: E402

for _entry in (*BUILTIN, TRACERL, TRACERL_VALUE):
    register(_entry)
_load_plugins()

__all__ = [
    "ALGORITHMS", "ALL_FAMILIES", "BLOCK", "MASKED", "PAPERS", "PLUGIN_ERRORS", "PLUGIN_GROUP", "PREFERENCE_ALGORITHMS", "RL_ENTRIES",
    "SFT_ALGORITHMS", "Default", "LoRA", "RLEntry", "TaskOverrides", "check_family", "describe", "family_key",
    "get_algorithm", "plugin_note", "register", "rl_entry",
]

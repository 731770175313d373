"""An RL algorithm's registry entry: the configured algorithm, its paper and the recipe defaults it owns.

A recipe `<family>-<name>` is the family's base run (`dare.recipes`) with the entry's `defaults` for
that family applied as dotted overrides, and `task=<task>` adds `task_overrides(family, task)`. Each
default says where it comes from: a line of the public DARE code (`dare`, `quote`: the line's text,
transcribed, so a reader checks it without the checkout and `tests/dare/test_defaults_table.py`
checks that the quoted text holds the value) or, for a deliberate difference or a value from another
source, a `reason`. docs/algorithms.md#dare-defaults is rendered from these entries
(`dare.algorithms.defaults_table`), and a test fails when the two part.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dllm_train import RLAlgorithm

DARE_REPO = "yjyddq/DARE@83ae8a3"
"""The public DARE code every `Default.dare` line points into unless its `repo` names another."""

TaskOverrides = Callable[[str, str], Mapping[str, object]]
"""(family, task) -> the dotted overrides DARE's script sets for that task (empty: nothing changes)."""


@dataclass(frozen=True, kw_only=True)
class Default:
    """One recipe default: a dotted config key, its value, and where the value comes from.

    Attributes:
        key: a dotted override key of an RL recipe (`rl.group_size`, `rollout.temperature`, `algorithm.mc_num`).
        value: the value (any value `dare train KEY=VALUE` accepts; tuples for list fields).
        dare: the `path:line` of the original code that sets it (in `repo`; DARE's, yjyddq/DARE at 83ae8a3,
            unless `repo` names another); empty for a difference.
        quote: that line's text (its relevant part), transcribed; the value must appear in it, or `proof` names
            the test that shows our setting runs what the line does (a rule DARE writes as code, not as a value).
        proof: `tests/...py::test_name`, the float64 test transcribing DARE's code that proves the equality.
        reason: why the value is not DARE's (a deliberate difference, or another source); empty when `dare` is set.
        families: the families this default applies to; empty: every family of the algorithm.
        repo: the public code `dare` points into, as `owner/name@commit`: DARE's by default; an algorithm that
            is not in DARE cites its authors' code (`Gen-Verse/dLLM-RL@10b4fd1`).
    """

    key: str
    value: object
    dare: str = ""
    quote: str = ""
    proof: str = ""
    reason: str = ""
    families: tuple[str, ...] = ()
    repo: str = DARE_REPO

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", self.key):
            raise ValueError(f"Default.key={self.key!r}: expected a dotted config key such as 'rl.group_size'")
        if bool(self.dare) == bool(self.reason):
            raise ValueError(f"Default {self.key}: give exactly one of dare= (a DARE file:line, with its quote) "
                             f"or reason= (a deliberate difference), got dare={self.dare!r}, reason={self.reason!r}")
        if self.dare and (not re.fullmatch(r"[\w./-]+:\d+(-\d+)?(,\d+(-\d+)?)*", self.dare) or not self.quote):
            raise ValueError(f"Default {self.key}: dare={self.dare!r} must be 'path:line' with the line's quote=")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40}", self.repo):
            raise ValueError(f"Default {self.key}: repo={self.repo!r} must be 'owner/name@commit' "
                             f"(e.g. {DARE_REPO!r})")
        if self.proof and not re.fullmatch(r"tests/[\w/]+\.py::test_\w+", self.proof):
            raise ValueError(f"Default {self.key}: proof={self.proof!r} must be 'tests/<path>.py::test_<name>'")

    def applies_to(self, family: str) -> bool:
        """Whether this default belongs to recipes of `family`."""
        return not self.families or family in self.families


@dataclass(frozen=True, kw_only=True)
class RLEntry:
    """A registered RL algorithm: its name, configured object, paper and the defaults of its recipes.

    Attributes:
        name: the registry name (`algorithm=NAME`, recipes `<family>-NAME`): lowercase, digits and '-'.
        algorithm: the configured `dllm_train.RLAlgorithm` (its dataclass fields are the `algorithm.*` keys).
        paper: the paper (or source) behind it, for `dare recipes`.
        defaults: the recipe values this algorithm sets on top of the family's base run.
        task_overrides: `task=<task>` settings; None: one setting for every task.
    """

    name: str
    algorithm: RLAlgorithm[Any]
    paper: str
    defaults: tuple[Default, ...] = ()
    task_overrides: TaskOverrides | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.name):
            raise ValueError(f"RLEntry.name={self.name!r}: use lowercase letters, digits and '-' (e.g. 'my-grpo')")
        if not isinstance(self.algorithm, RLAlgorithm):
            raise TypeError(f"RLEntry {self.name!r}: algorithm={type(self.algorithm).__name__} does not implement "
                            "dllm_train.RLAlgorithm (prepare / values / loss / advantages)")
        for d in self.defaults:
            unknown = set(d.families) - set(self.algorithm.families)
            if unknown:
                raise ValueError(f"RLEntry {self.name!r}: default {d.key} names families {sorted(unknown)} that the "
                                 f"algorithm does not support ({list(self.algorithm.families)})")

    def defaults_for(self, family: str) -> dict[str, object]:
        """key -> value of the defaults that apply to `family` (a later default of a key wins)."""
        return {d.key: d.value for d in self.defaults if d.applies_to(family)}


Overrides = Mapping[str, Any]

__all__ = ["DARE_REPO", "Default", "RLEntry", "TaskOverrides"]

"""The objective protocol: flags of an algorithm's math are class constants, never dataclass fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest

from dllm_algorithms import D1, DMPO, SFT, VRPO, DTreeRPO
from dllm_train import Objective, OfflineObjective, RLAlgorithm


@pytest.mark.parametrize("entry", [D1(), DMPO(), DTreeRPO(), SFT(), VRPO()], ids=lambda e: type(e).__name__)
def test_no_constant_of_the_protocol_is_a_field(entry: Objective[object, object]) -> None:
    constants = set(type(entry).constants)
    assert {"row_local", "needs_reference", "families"} <= constants
    if isinstance(entry, RLAlgorithm):
        assert {"needs_old", "needs_rollout_reference", "replays_trajectory", "chunkable_rollout"} <= constants
    assert not constants & {f.name for f in dataclasses.fields(entry)}


@pytest.mark.parametrize(("base", "name"), [(D1, "row_local"), (D1, "needs_old"), (DMPO, "needs_rollout_reference"),
                                            (VRPO, "share_masks"), (SFT, "row_local")])
def test_a_subclass_that_annotates_a_constant_as_a_field_is_refused(base: type, name: str) -> None:
    # as a field it would become a config key (`algorithm.row_local=...` on the command line)
    with pytest.raises(TypeError, match=f"{name} is annotated as a field, but {name} is a constant"):
        dataclass(frozen=True)(type("Bad", (base,), {"__annotations__": {name: "bool"}, name: True}))


def test_a_subclass_may_restate_a_constant_as_a_class_variable() -> None:
    @dataclass(frozen=True)
    class Local(D1):
        row_local: ClassVar[bool] = False

    assert Local().row_local is False and "row_local" not in {f.name for f in dataclasses.fields(Local())}
    assert issubclass(SFT, OfflineObjective) and issubclass(D1, Objective)

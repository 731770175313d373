"""The clip settings are defined once (`dllm_algorithms.clipping`) and validated when an algorithm is built."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import dllm_algorithms as da
from dllm_algorithms.clipping import DualClip, RatioClip

# every algorithm with a clipped policy ratio, and the clip fields it had before they moved to the mixins
CLIPPED: dict[type[Any], dict[str, float | None]] = {
    da.D1: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.CoupledGRPO: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.JustGRPO: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.BGPO: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.CJGRPO: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.BridgeRatioGRPO: {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0},
    da.ESPO: {"clip_low": 0.2, "clip_high": 0.2},
    da.EBPO: {"clip_low": 0.2, "clip_high": 0.2},
}
CLIP_FIELDS = ("clip_low", "clip_high", "dual_clip")


@pytest.mark.parametrize("cls", list(CLIPPED), ids=lambda c: c.__name__)
def test_clip_fields_keep_their_names_and_defaults_and_have_one_definition(cls: type[Any]) -> None:
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.name in CLIP_FIELDS}
    assert fields == CLIPPED[cls]
    assert issubclass(cls, DualClip if "dual_clip" in fields else RatioClip)
    assert not set(CLIP_FIELDS) & set(cls.__dict__.get("__annotations__", {})), "declared again in the class"


def test_no_other_algorithm_declares_clip_fields() -> None:
    for name in da.__all__:
        cls = getattr(da, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls not in (*CLIPPED, RatioClip, DualClip):
            if issubclass(cls, RatioClip):  # added later (GDPO): the mixin's fields, never declared again
                assert not set(CLIP_FIELDS) & set(cls.__dict__.get("__annotations__", {})), name
                continue
            assert not set(CLIP_FIELDS) & {f.name for f in dataclasses.fields(cls)}, name


@pytest.mark.parametrize(("cls", "field", "value", "message"), [
    (da.D1, "clip_low", 1.5, r"algorithm.clip_low must lie in \[0, 1\]"),
    (da.D1, "clip_low", -0.1, r"algorithm.clip_low must lie in \[0, 1\]"),
    (da.ESPO, "clip_high", -0.1, r"algorithm.clip_high must be >= 0"),  # its own __post_init__ chains to the mixin
    (da.EBPO, "clip_high", math.inf, r"algorithm.clip_high must be a finite number"),
    (da.BGPO, "dual_clip", 1.0, r"algorithm.dual_clip must be > 1"),
    (da.JustGRPO, "dual_clip", 0.5, r"algorithm.dual_clip must be > 1"),
    (da.BridgeRatioGRPO, "clip_low", math.nan, r"algorithm.clip_low must be a finite number"),
])
def test_a_bad_clip_setting_fails_when_the_algorithm_is_built(cls: type[Any], field: str, value: float,
                                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**{field: value})


def test_the_edges_the_losses_accept_are_accepted_and_own_checks_still_run() -> None:
    assert da.D1(clip_low=0.0, clip_high=0.0, dual_clip=None).dual_clip is None
    assert da.ESPO(clip_low=1.0).clip_low == 1.0
    with pytest.raises(ValueError, match="num_iterations"):
        da.ESPO(num_iterations=0)
    with pytest.raises(ValueError, match="temperature"):
        da.JustGRPO(temperature=0.0)
    with pytest.raises(ValueError, match="correction"):
        da.BridgeRatioGRPO(correction="nope")


def test_recipes_resolve_the_clip_keys_as_before() -> None:
    from dare.config import apply_overrides, run_config_from_dict, to_dict
    from dare.recipes import RECIPES, get_recipe

    for name in RECIPES:
        cfg = get_recipe(name)
        algorithm = getattr(cfg, "algorithm", None)
        if type(algorithm) not in CLIPPED:
            continue
        section = to_dict(cfg)["algorithm"]
        assert {k: section[k] for k in CLIPPED[type(algorithm)]} == CLIPPED[type(algorithm)], name
        changed = apply_overrides(cfg, ["algorithm.clip_low=0.1", "algorithm.clip_high=0.28"])
        assert (changed.algorithm.clip_low, changed.algorithm.clip_high) == (0.1, 0.28)
        assert run_config_from_dict(to_dict(changed)) == changed
        with pytest.raises(ValueError, match=r"algorithm.clip_low must lie in \[0, 1\]"):
            apply_overrides(cfg, ["algorithm.clip_low=1.5"])

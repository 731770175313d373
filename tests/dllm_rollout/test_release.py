"""A decode that stops on an exception (an interrupt, an out-of-memory error, a time box) frees its KV
cache at once: the captured steps hold bound methods of the cache's owner, a reference cycle that would
otherwise keep the canvas-wide cache alive until the next garbage collection, beside a retry's own."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import dllm_rollout.block as block
import dllm_rollout.masked as masked
from dllm_rollout import generate
from tests.dllm_rollout.conftest import tiny


class Abort(Exception):
    """Raised from a forward hook after a few forwards."""


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _owners(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[weakref.ref[Any]]:
    """Weak references to every `cls` built from now on."""
    refs: list[weakref.ref[Any]] = []
    init = cls.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        refs.append(weakref.ref(self))

    monkeypatch.setattr(cls, "__init__", spy)
    return refs


def _abort_after(model: torch.nn.Module, forwards: int) -> Any:
    seen = [0]

    def hook(*_: Any) -> None:
        seen[0] += 1
        if seen[0] > forwards:
            raise Abort

    return model.register_forward_pre_hook(hook)


@pytest.mark.parametrize("family, cls, cache", [
    ("llada", masked._BlockLogits, "prefix"),
    ("llada", masked._BlockLogits, "dual"),
    ("sdar", block._CachedBlocks, "prefix"),
])
def test_an_aborted_decode_frees_its_cache_without_the_gc(monkeypatch: pytest.MonkeyPatch, no_gc: None,
                                                           family: str, cls: type, cache: str) -> None:
    model = tiny(family)
    refs = _owners(monkeypatch, cls)
    handle = _abort_after(model, 3)
    with pytest.raises(Abort):
        generate(model, [[1, 2, 3, 4, 5], [6, 7]], max_new_tokens=16, steps=16, block_length=4, cache=cache)
    handle.remove()
    assert len(refs) == 1
    assert refs[0]() is None  # freed by reference counting: no cycle left
    # the decode that finishes frees it too
    generate(model, [[1, 2, 3, 4, 5], [6, 7]], max_new_tokens=8, steps=8, block_length=4, cache=cache)
    assert len(refs) == 2 and refs[1]() is None

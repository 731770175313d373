"""The clip settings of a clipped policy ratio, defined once for every algorithm that clips one.

An algorithm inherits `RatioClip` (the clip range) or `DualClip` (the range and the dual-clip
constant) before `dllm_train.RLAlgorithm`; the fields keep their names (`algorithm.clip_low`,
`algorithm.clip_high`, `algorithm.dual_clip` on the command line) and are validated when the
algorithm is built, by the rules of `dllm_objectives.policy`'s losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def _parent_post_init(obj: Any, cls: type[Any]) -> None:
    """Run the `__post_init__` after `cls` in `obj`'s MRO, if there is one (cooperative mixins)."""
    parent = getattr(super(cls, obj), "__post_init__", None)
    if parent is not None:
        parent()


@dataclass(frozen=True, kw_only=True)
class RatioClip:
    """The clip range of a policy ratio (Schulman et al., arXiv 1707.06347, Eq. 7).

    Attributes:
        clip_low, clip_high: clip range of the ratio, [1 - clip_low, 1 + clip_high] (clip_high > clip_low:
            DAPO's clip-higher).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"algorithm.{name} must be a finite number, got {getattr(self, name)}")
        if not 0.0 <= self.clip_low <= 1.0:
            raise ValueError(f"algorithm.clip_low must lie in [0, 1] (the ratio floor is 1 - clip_low), "
                             f"got {self.clip_low}; the default is 0.2")
        if self.clip_high < 0.0:
            raise ValueError(f"algorithm.clip_high must be >= 0, got {self.clip_high}; the default is 0.2")
        _parent_post_init(self, RatioClip)


@dataclass(frozen=True, kw_only=True)
class DualClip(RatioClip):
    """The clip range of a policy ratio and the dual clip of negative advantages (Ye et al., arXiv 1912.09729).

    Attributes:
        dual_clip: dual-clip constant c > 1: the loss of a negative advantage is at most -A c (None: off).
    """

    dual_clip: float | None = 3.0

    def __post_init__(self) -> None:
        if self.dual_clip is not None and not (math.isfinite(self.dual_clip) and self.dual_clip > 1.0):
            raise ValueError(f"algorithm.dual_clip must be > 1 (or unset: off), got {self.dual_clip}; "
                             "the default is 3.0")
        super().__post_init__()


__all__ = ["DualClip", "RatioClip"]

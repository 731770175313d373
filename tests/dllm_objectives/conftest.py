"""Shared fixtures for dllm_objectives tests: a toy joint with exact conditionals
(docs/algorithms.md#elbo)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

V, L = 3, 4


@dataclass(frozen=True)
class ToyJoint:
    """A random joint ``p`` over ``V**L`` sequences and one observed sequence ``o``."""

    table: Tensor  # float64 [V] * L, sums to 1
    o: tuple[int, ...]

    @property
    def log_p(self) -> float:
        return math.log(float(self.table[self.o]))

    def cond_logp(self, masked: tuple[bool, ...]) -> Tensor:
        """Exact ``log p(o_j | o_unmasked)`` for every position (value at unmasked j is junk 0)."""
        marg = self.table
        # sum out nothing yet; for each masked j compute p(o_j, o_vis) / p(o_vis)
        vis_idx = [self.o[i] if not m else slice(None) for i, m in enumerate(masked)]
        sub = marg[tuple(vis_idx)]  # dims = masked positions, in order
        masked_pos = [i for i, m in enumerate(masked) if m]
        total = sub.sum()
        out = torch.zeros(L, dtype=torch.float64)
        for d, j in enumerate(masked_pos):
            other = [e for e in range(len(masked_pos)) if e != d]
            pj = sub.sum(dim=other) if other else sub
            out[j] = math.log(float(pj[self.o[j]] / total))
        return out

    def token_logp(self, mask: Tensor) -> Tensor:
        """``[B, N, L]`` exact conditional log-probs for a batch of masks (all rows are ``o``)."""
        table = {m: self.cond_logp(m) for m in itertools.product([False, True], repeat=L)}
        flat = mask.reshape(-1, L).tolist()
        rows = torch.stack([table[tuple(bool(x) for x in r)] for r in flat])
        return rows.reshape(mask.shape).float()

    def all_masks(self) -> list[tuple[bool, ...]]:
        return list(itertools.product([False, True], repeat=L))


@pytest.fixture(scope="session")
def toy() -> ToyJoint:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn([V] * L, generator=g, dtype=torch.float64) * 1.5
    table = torch.softmax(logits.flatten(), 0).reshape([V] * L)
    return ToyJoint(table=table, o=(2, 0, 1, 2))


@pytest.fixture()
def gen() -> Callable[[int], torch.Generator]:
    return lambda seed: torch.Generator().manual_seed(seed)

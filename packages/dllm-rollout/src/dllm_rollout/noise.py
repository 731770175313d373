"""Per-row random numbers drawn on the device: counter-based, replayable, no host work.

Row b's n-th number is a function of (seed_b, n) alone: the SplitMix64 output
`mix(key_b + n * GOLDEN)` with `key_b = mix(seed_b)` (Steele, Lea and Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014), its top 23 bits mapped to the open interval (0, 1).
A row draws only while it is active, so a sample decodes the same alone or in any batch (replay).

Unlike one `torch.Generator` per row, a draw for the whole batch is a handful of vectorised
integer ops: no Python loop over rows, no read-back of which rows are active (a host sync), and
the per-row counters are updated in place, so a decoding step that draws can be replayed from a
CUDA graph. Integer arithmetic is exact on every device: CPU and GPU draw the same numbers.
"""

from __future__ import annotations

import math

import torch


def _int64(c: int) -> int:
    """The unsigned 64-bit constant `c` as the signed int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


GOLDEN = _int64(0x9E3779B97F4A7C15)
_M1 = _int64(0xBF58476D1CE4E5B9)
_M2 = _int64(0x94D049BB133111EB)
BITS = 23  # numbers are (k + 0.5) / 2**23, k < 2**23: exact in float32, never 0 or 1


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's `>>` on int64 is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors (wrapping arithmetic, bit-exact on any device)."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def to_unit(bits: torch.Tensor) -> torch.Tensor:
    """float32 numbers in (0, 1) from the top BITS bits of int64 words."""
    k = _shr(bits, 64 - BITS).to(torch.float32)
    return (k + 0.5) * (1.0 / (1 << BITS))


class RowNoise:
    """Independent U(0, 1) streams, one per row, advanced only for active rows (see module doc).

    Attributes:
        key: [B] int64 per-row stream keys (mix64 of the seeds).
        drawn: [B] int64 numbers each row has drawn so far (updated in place).
    """

    def __init__(self, seeds: torch.Tensor, device: torch.device | str | None = None) -> None:
        """Args: seeds: [B] integer seeds (any device); device: where the numbers are drawn."""
        seeds = seeds.to(device=device if device is not None else seeds.device, dtype=torch.long)
        self.key = mix64(seeds + GOLDEN)
        self.drawn = torch.zeros_like(self.key)

    def uniform(self, shape: tuple[int, ...], active: torch.Tensor) -> torch.Tensor:
        """U(0, 1) numbers [B, *shape] in float32; row b's are its next prod(shape) numbers in row-major
        order if active[b], else 0.5 (and its stream does not advance).

        Args:
            active: [B] bool.
        """
        n = math.prod(shape)
        index = self.drawn[:, None] + torch.arange(1, n + 1, device=self.key.device)[None]
        u = to_unit(mix64(self.key[:, None] + index * GOLDEN))
        u = torch.where(active[:, None], u, torch.full_like(u, 0.5))
        self.drawn.add_(active.long() * n)
        return u.view(-1, *shape)

    def rows(self, keep: torch.Tensor) -> RowNoise:
        """The streams of rows `keep` [n] (long) only, each where it stands (a copy)."""
        sub = RowNoise.__new__(RowNoise)
        sub.key, sub.drawn = self.key[keep], self.drawn[keep]
        return sub

"""Stateless seeding: every random draw of a run is a function of (root seed, purpose, step)."""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from the root seed and any keys (e.g. "rollout", step)."""
    text = ":".join([str(seed), *map(str, keys)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & (2**63 - 1)


def generator(seed: int, *keys: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded by `derive_seed(seed, *keys)`."""
    return torch.Generator(device=device).manual_seed(derive_seed(seed, *keys))


def sample_seeds(seed: int, count: int, *keys: object) -> torch.Tensor:
    """[count] per-sample seeds for one rollout batch."""
    return torch.tensor([derive_seed(seed, *keys, i) for i in range(count)], dtype=torch.long)

"""Turning lists of token ids of any lengths into a left-padded batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts to a common length.

    Returns:
        ids: [B, P] long; mask: [B, P] bool (True on real tokens).
    """
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one list of token ids")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ValueError(f"prompt {lengths.index(0)} is empty: every prompt needs at least one token")
    width = max(lengths)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = True
    return ids.to(device), mask.to(device)


def sample_seeds(seed: int | Sequence[int] | None, batch_size: int) -> torch.Tensor:
    """Per-sample seeds [B]: an int seeds sample i with a value derived from (seed, i)."""
    if seed is None:
        base = int(torch.randint(0, 2**62, (1,)).item())
        return torch.tensor([_mix(base, i) for i in range(batch_size)], dtype=torch.long)
    if isinstance(seed, int):
        return torch.tensor([_mix(seed, i) for i in range(batch_size)], dtype=torch.long)
    seeds = [int(s) for s in seed]
    if len(seeds) != batch_size:
        raise ValueError(f"seed has {len(seeds)} entries but there are {batch_size} prompts; pass one per prompt")
    return torch.tensor(seeds, dtype=torch.long)


def _mix(seed: int, index: int) -> int:
    """SplitMix64 of (seed, index): distinct, well-spread seeds per sample."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF

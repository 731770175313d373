"""The family sets an algorithm declares it runs on (`RLAlgorithm.families`), from dllm_models' registry."""

from __future__ import annotations

from dllm_models import family_names

MASKED = family_names("masked")
"""Canonical names of the masked-diffusion families (bidirectional, one canvas), from dllm_models' registry."""
BLOCK = family_names("block")
"""Canonical names of the block-diffusion families (block-causal, BD3LM likelihood)."""
ALL_FAMILIES = MASKED + BLOCK


__all__ = ["ALL_FAMILIES", "BLOCK", "MASKED"]

"""A value model (critic): a family backbone with a scalar head on its final hidden state.

The value of position ``j`` is ``w . h_j`` with ``h_j`` the backbone's final hidden state (the
input of its output head) and ``w`` a bias-free linear head of one output, zero-initialised so
that every first value is 0. This is the critic of PPO-style actor-critic RL with a per-position
value (e.g. TraceRL, Wang et al., arXiv 2509.06949, whose authors build theirs the same way:
Gen-Verse/dLLM-RL at 10b4fd1, train/init_sdar_value_model.py:47-89: the policy checkpoint, a
``Linear(hidden_size, 1, bias=False)`` value head, its weight zeroed, the checkpoint's dtype).
The backbone keeps its output head (unused: it receives no gradient), as theirs does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from dllm_models.logprob import final_hidden, output_head


def head_width(model: nn.Module) -> int:
    """The hidden size H of a family module: the input width of its output head."""
    head = output_head(model)
    width = getattr(head, "in_features", None)
    if width is None:
        weight = getattr(head, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise ValueError(f"the output head of {type(model).__name__} has no in_features or weight to size a "
                             "value head from")
        width = weight.shape[-1]
    return int(width)


class ValueModel(nn.Module):
    """A family backbone and a zero-initialised scalar head: per-position values ``[B, L]``.

    Args:
        backbone: a dllm_models family module (owned: pass a copy to keep the policy apart,
            `ValueModel.from_policy`).

    Attributes:
        backbone: the family module.
        value_head: ``Linear(H, 1, bias=False)`` in the backbone's dtype and device, weight 0.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        weight = next(backbone.parameters())
        # skip_init: no draw from the global RNG (the weight is zeroed below)
        self.value_head: nn.Linear = torch.nn.utils.skip_init(  # type: ignore[no-untyped-call]
            nn.Linear, head_width(backbone), 1, bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.value_head.weight.zero_()

    @classmethod
    def from_policy(cls, policy: nn.Module) -> ValueModel:
        """A value model on a deep copy of `policy` (its weights now; the policy is not touched)."""
        return cls(copy.deepcopy(policy))

    @property
    def traits(self) -> Any:
        """The backbone's `DiffusionTraits` (mask id, block length, logit shift...)."""
        return self.backbone.traits

    def forward(self, input_ids: torch.Tensor, **forward_kwargs: Any) -> torch.Tensor:
        """Values ``[B, L]`` of one forward (``attention_mask``, ``position_ids``... go to the backbone).

        Args:
            input_ids: long ``[B, L]``.

        Returns:
            ``[B, L]`` in the head's dtype: position ``j``'s value read at its own hidden state.
        """
        hidden = final_hidden(self.backbone, input_ids, **forward_kwargs)
        values: torch.Tensor = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)
        return values


__all__ = ["ValueModel", "head_width"]

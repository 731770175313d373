"""Mixture-of-experts pieces shared by SDAR-MoE (Qwen3-MoE) and LLaDA2 (Ling-2.0).

Routers return (expert ids [T, k], combine weights [T, k]); `SparseMoE` runs only the experts
some token picked (a loop over active experts) and adds an optional shared expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dllm_models.layers import PLAIN, FastLinear, KernelConfig, swiglu


class MLP(nn.Module):
    """SwiGLU feed-forward `down(silu(gate(x)) * up(x))` with HF parameter names."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = FastLinear(hidden, intermediate, bias=False)
        self.up_proj = FastLinear(hidden, intermediate, bias=False)
        self.down_proj = FastLinear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, kernels: KernelConfig = PLAIN) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        out: torch.Tensor = self.down_proj(swiglu(gate, up, kernels))
        return out


class SoftmaxTopKRouter(nn.Module):
    """Qwen3-MoE router: softmax over all experts in fp32, top-k, optionally renormalised.

    The gate runs in the model dtype; the combine weights are cast back to it.
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, *, norm_topk_prob: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (ids [T, k], weights [T, k] in x's dtype)."""
        probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype)


class GroupLimitedSigmoidRouter(nn.Module):
    """Ling-2.0 / DeepSeek-V3 router: sigmoid scores, biased group-limited top-k selection.

    Selection uses scores + `expert_bias`: experts are split into `n_group` groups, a group
    scores the sum of its top-2 biased scores, the best `topk_group` groups are kept and the
    top-k experts are chosen inside them. Combine weights are the unbiased sigmoid scores of the
    chosen experts, normalised to sum 1 (+1e-20) and multiplied by `routed_scaling_factor`.
    The gate runs in fp32 (input and weight upcast).
    """

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        *,
        n_group: int,
        topk_group: int,
        routed_scaling_factor: float,
        norm_topk_prob: bool = True,
    ) -> None:
        super().__init__()
        if num_experts % n_group:
            raise ValueError(f"num_experts ({num_experts}) must be divisible by n_group ({n_group})")
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.expert_bias: torch.Tensor
        self.register_buffer("expert_bias", torch.zeros(num_experts))
        self.top_k = top_k
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.norm_topk_prob = norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (ids [T, k], weights [T, k] fp32)."""
        t = x.shape[0]
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        biased = scores + self.expert_bias
        grouped = biased.view(t, self.n_group, -1)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.topk(group_scores, self.topk_group, dim=-1, sorted=False).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(t, -1)
        ids = torch.topk(biased.masked_fill(~expert_mask, float("-inf")), self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.top_k > 1 and self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * self.routed_scaling_factor


class SparseMoE(nn.Module):
    """Routed experts (+ optional shared expert) over tokens [B, L, H].

    Args:
        gate: a router returning (ids, weights).
        hidden, intermediate, num_experts: expert shapes.
        shared_intermediate: width of the shared expert; 0 for none.
        accumulate_fp32: combine expert outputs in fp32 and round once before adding the shared
            expert (Ling-2.0 `moe_infer`); otherwise accumulate in the model dtype expert by
            expert (Qwen3-MoE).
    """

    def __init__(
        self,
        gate: nn.Module,
        hidden: int,
        intermediate: int,
        num_experts: int,
        *,
        shared_intermediate: int = 0,
        accumulate_fp32: bool = False,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.experts = nn.ModuleList(MLP(hidden, intermediate) for _ in range(num_experts))
        self.shared_experts = MLP(hidden, shared_intermediate) if shared_intermediate else None
        self.accumulate_fp32 = accumulate_fp32

    def forward(self, x: torch.Tensor, kernels: KernelConfig = PLAIN) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        ids, weights = self.gate(flat)
        out = self._combine(flat, ids, weights, kernels).view(shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, kernels)
        return out

    def _combine(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, kernels: KernelConfig
    ) -> torch.Tensor:
        t, k = ids.shape
        flat_ids = ids.reshape(-1)
        token = torch.arange(t, device=x.device).repeat_interleave(k)
        active = torch.unique(flat_ids).tolist()
        if self.accumulate_fp32:
            slots = x.new_zeros((t * k, x.shape[-1]), dtype=torch.float32)
            for e in active:
                sel = (flat_ids == e).nonzero().squeeze(-1)
                slots = slots.index_copy(0, sel, self.experts[e](x[token[sel]], kernels).float())
            mixed = (slots.view(t, k, -1) * weights.float()[..., None]).sum(dim=1)
            return mixed.to(x.dtype)
        out = torch.zeros_like(x)
        flat_w = weights.reshape(-1)
        for e in active:
            sel = (flat_ids == e).nonzero().squeeze(-1)
            rows = token[sel]
            y = self.experts[e](x[rows], kernels) * flat_w[sel, None].to(x.dtype)
            out = out.index_add(0, rows, y)
        return out

"""Decoding with fused projections: q/k/v and gate/up as one GEMM each (`fused_projections`).

At a decoding step a forward is a few tokens per row, so the k and v projections of a GQA layer
(a tenth of its q width) and the two halves of a SwiGLU MLP are small GEMMs, each launched on its
own. Inference engines (lmdeploy, vLLM) keep them concatenated: one GEMM of width q + 2 kv, one of
width 2 x intermediate. `fused_projections` gives the Qwen-layout layers (SDAR, SDAR-MoE's
attention, Dream) concatenated copies of their weights for the duration of a block, so a decoder
runs those GEMMs fused, and drops them after: the parameters, their names and the trainer's view
of the model do not change. The copies cost the bytes of the fused weights (9 GB at SDAR-8B)
while they exist. LoRA layers are fused inside `lora.merged_adapters` (the rollout worker's
decode: adapters folded into the base weights and off); layers with active adapters, sharded
DTensor weights and the experts of a MoE keep their separate GEMMs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

# decode with fused projections (`dllm_rollout.decode` enters `fused_projections`); off until measured
FUSED_PROJECTIONS = os.environ.get("DLLM_MODELS_FUSED_PROJECTIONS", "0") == "1"


def _linear(m: Any) -> nn.Linear | None:
    """The plain `nn.Linear` that computes `m`: `m` itself, or the base layer of a LoRA layer whose
    adapters are off (`lora.merged_adapters` folds them into the base weight while decoding);
    None for anything else (active adapters, another wrapper, sharded DTensor weights)."""
    if getattr(m, "disable_adapters", False) and hasattr(m, "get_base_layer"):
        m = m.get_base_layer()
    if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and not hasattr(m.weight, "device_mesh"):
        return m
    return None


def _plain(*layers: Any) -> list[nn.Linear] | None:
    """The plain linear maps of `layers` (`_linear`), or None when one has none."""
    plain = [_linear(m) for m in layers]
    return None if any(p is None for p in plain) else [p for p in plain if p is not None]


@contextmanager
def fused_projections(model: nn.Module) -> Iterator[int]:
    """Within the block, Qwen-layout attention runs q/k/v as one GEMM and dense SwiGLU MLPs run
    gate/up as one, on concatenated copies of their weights (module doc). Yields how many layers
    were fused; the copies are dropped on exit."""
    from dllm_models.families.moe import MLP
    from dllm_models.families.qwen import QwenAttention

    fused: list[tuple[nn.Module, tuple[str, ...]]] = []  # a layer and the attributes set on it
    with torch.no_grad():
        for layer in model.modules():
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            qkv = _plain(attn.q_proj, attn.k_proj, attn.v_proj) if isinstance(attn, QwenAttention) else None
            if isinstance(attn, QwenAttention) and qkv is not None:
                attn.qkv = torch.cat(tuple(m.weight for m in qkv))
                biases: list[torch.Tensor] = [m.bias for m in qkv if m.bias is not None]
                attn.qkv_bias = torch.cat(biases) if len(biases) == len(qkv) else None
                fused.append((attn, ("qkv", "qkv_bias")))
            gate_up = _plain(mlp.gate_proj, mlp.up_proj) if isinstance(mlp, MLP) else None
            if isinstance(mlp, MLP) and gate_up is not None:
                mlp.gate_up = torch.cat(tuple(m.weight for m in gate_up))
                fused.append((mlp, ("gate_up",)))
    try:
        yield len(fused)
    finally:
        for layer, names in fused:
            for name in names:
                setattr(layer, name, None)

"""Decoding with fused projections: q/k/v and gate/up as one GEMM each (`fused_projections`).

At a decoding step a forward is a few tokens per row, so the k and v projections of a GQA layer
(a tenth of its q width) and the two halves of a SwiGLU MLP are small GEMMs, each launched on its
own. Inference engines (lmdeploy, vLLM) keep them concatenated: one GEMM of width q + 2 kv, one of
width 2 x intermediate. `fused_projections` gives the Qwen-layout layers (SDAR, SDAR-MoE's
attention, Dream) concatenated copies of their weights for the duration of a block, so a decoder
runs those GEMMs fused, and drops them after: the parameters, their names and the trainer's view
of the model do not change. The copies cost the bytes of the fused weights (9 GB at SDAR-8B)
while they exist. Layers whose projections are not plain linear layers (LoRA wrappers, sharded
DTensor weights, the experts of a MoE) keep their separate GEMMs.
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


def _plain(*layers: Any) -> bool:
    """Whether every layer is a plain `nn.Linear` (not a wrapper) with local (not sharded) weights."""
    return all(isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward
               and not hasattr(m.weight, "device_mesh") for m in layers)


@contextmanager
def fused_projections(model: nn.Module) -> Iterator[int]:
    """Within the block, Qwen-layout attention runs q/k/v as one GEMM and dense SwiGLU MLPs run
    gate/up as one, on concatenated copies of their weights (module doc). Yields how many layers
    were fused; the copies are dropped on exit."""
    from dllm_models.families.moe import MLP
    from dllm_models.families.qwen import QwenAttention

    fused: list[Any] = []
    with torch.no_grad():
        for layer in model.modules():
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if isinstance(attn, QwenAttention) and _plain(attn.q_proj, attn.k_proj, attn.v_proj):
                attn.qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
                if attn.q_proj.bias is not None:
                    attn.qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                fused.append(attn)
            if isinstance(mlp, MLP) and _plain(mlp.gate_proj, mlp.up_proj):
                mlp.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                fused.append(mlp)
    try:
        yield len(fused)
    finally:
        for m in fused:
            m.drop_fused()

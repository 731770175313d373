"""The Qwen2/Qwen3 decoder layout shared by Dream, SDAR and SDAR-MoE.

Parameter names are transformers' (`model.embed_tokens`, `model.layers.{i}.self_attn.q_proj`,
`...mlp.gate_proj`, `model.norm`, `lm_head`), so the release safetensors load as they are.
A family subclasses `QwenStyleLM`, choosing q/k/v biases (Qwen2), per-head q/k norms (Qwen3),
the norm numerics, the MLP of each layer and its traits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dllm_models.attention import AttentionMask, attend
from dllm_models.families.backbone import HeadedDiffusionLM, attention_inputs, run_layers
from dllm_models.layers import PLAIN, FastEmbedding, KernelConfig, RMSNorm, rope_cos_sin, rotate_heads
from dllm_models.protocol import DiffusionTraits, KVCache, LayerPast


class QwenAttention(nn.Module):
    """GQA self-attention; optional q/k/v biases and per-head RMSNorm on q and k before RoPE."""

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool,
        qk_norm_eps: float | None,
        scale_in_fp32: bool,
    ) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(
                f"num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads "
                f"({n_kv_heads})"
            )
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden, bias=False)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, scale_in_fp32=scale_in_fp32)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, scale_in_fp32=scale_in_fp32)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: AttentionMask,
        backend: str,
        past: LayerPast | None = None,
        kernels: KernelConfig = PLAIN,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, n, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(b, n, -1, hd)
        k = self.k_proj(x).view(b, n, -1, hd)
        v = self.v_proj(x).view(b, n, -1, hd).transpose(1, 2)
        q = rotate_heads(q, cos, sin, norm=self.q_norm, full_precision=False, kernels=kernels)
        k = rotate_heads(k, cos, sin, norm=self.k_norm, full_precision=False, kernels=kernels)
        new_kv = (k, v)
        if past is not None:
            k, v = past.join(k, v)
        att = attend(q, k, v, mask, backend=backend, kernels=kernels).transpose(1, 2).reshape(b, n, -1)
        out: torch.Tensor = self.o_proj(att)
        return out, new_kv


class QwenDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attn: QwenAttention, mlp: nn.Module, hidden: int, eps: float, scale_in_fp32: bool) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden, eps, scale_in_fp32=scale_in_fp32)
        self.post_attention_layernorm = RMSNorm(hidden, eps, scale_in_fp32=scale_in_fp32)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: AttentionMask,
        backend: str,
        past: LayerPast | None = None,
        kernels: KernelConfig = PLAIN,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h = self.input_layernorm(x, kernels)
        att, kv = self.self_attn(h, cos, sin, mask, backend, past, kernels)
        h, x = self.post_attention_layernorm.add_forward(x, att, kernels)
        out: torch.Tensor = x + self.mlp(h, kernels)
        return out, kv


class QwenBody(nn.Module):
    """`model.*`: embeddings, decoder layers and the final norm."""

    def __init__(self, vocab: int, hidden: int, layers: list[nn.Module], eps: float, scale_in_fp32: bool) -> None:
        super().__init__()
        self.embed_tokens = FastEmbedding(vocab, hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps, scale_in_fp32=scale_in_fp32)


class QwenStyleLM(HeadedDiffusionLM):
    """Qwen-layout diffusion LM; subclasses build `self.model`, `self.lm_head` and `self.traits`.

    Attributes:
        rotary_dim, rope_theta: RoPE of every layer.
        block_length: native block size for block-causal attention; None for bidirectional.
    """

    traits: DiffusionTraits
    model: QwenBody
    lm_head: nn.Linear

    def __init__(self, *, rotary_dim: int, rope_theta: float, block_length: int | None) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.rope_theta = rope_theta
        self.block_length = block_length
        self.attention_backend = "sdpa"
        self.gradient_checkpointing = False

    def build(
        self,
        *,
        vocab: int,
        hidden: int,
        n_layers: int,
        eps: float,
        scale_in_fp32: bool,
        make_layer: Callable[[int], nn.Module],
    ) -> None:
        """Create `model` and `lm_head` (called by subclasses from __init__)."""
        layers = [make_layer(i) for i in range(n_layers)]
        self.model = QwenBody(vocab, hidden, layers, eps, scale_in_fp32)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def get_output_embeddings(self) -> nn.Linear:
        """The LM head ([V, H] weight)."""
        return self.lm_head

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        attention: AttentionMask | None = None,
        attention_backend: str | None = None,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """(final hidden states [B, L, H] after the final norm, KVCache of this call or None)."""
        mask, position_ids = attention_inputs(
            input_ids, attention_mask, position_ids, past_key_values, self.block_length, attention
        )
        cos, sin = rope_cos_sin(position_ids, self.rotary_dim, self.rope_theta)
        x = self.model.embed_tokens(input_ids)
        x, cache = run_layers(
            self, self.model.layers, x, cos, sin, mask, past_key_values, use_cache, attention_mask,
            backend=attention_backend,
        )
        hidden: torch.Tensor = self.model.norm(x, self.kernels)
        return hidden, cache

"""LLaDA2.x (LLaDA2.0-mini, LLaDA2.1-mini): block diffusion on the Ling-2.0 MoE layout.

inclusionAI, "LLaDA2.0: Scaling Up Diffusion Language Models to 100B", arXiv 2512.15745.
Fused `query_key_value` projection split as [Q heads | K heads | V heads], per-head RMSNorm on q
and k, partial RoPE on the first `head_dim * partial_rotary_factor` dims (factor 0.5 by default,
as in the release code), block-causal attention on the grid aligned to absolute position 0 (block
32 by default), the first `first_k_dense_replace` layers dense and the rest MoE with a grouped
sigmoid router and a shared expert, fp32 logits. Parameter names match the release
checkpoint (`model.word_embeddings`, `model.layers.{i}.attention.dense`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dllm_models.attention import AttentionMask, attend
from dllm_models.families.backbone import HeadedDiffusionLM, attention_inputs, run_layers
from dllm_models.families.hf_config import config_from_hf, config_to_hf
from dllm_models.families.moe import MLP, GroupLimitedSigmoidRouter, SparseMoE
from dllm_models.layers import PLAIN, FastEmbedding, KernelConfig, RMSNorm, rope_cos_sin, rotate_heads
from dllm_models.protocol import DiffusionTraits, KVCache, LayerPast

MASK_TOKEN_ID = 156895
EOS_TOKEN_ID = 156892
PAD_TOKEN_ID = 156892
BLOCK_LENGTH = 32


@dataclass(frozen=True)
class LLaDA2Config:
    """Shape and constants of a LLaDA2.x model, read from its config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    vocab_size: int
    head_dim: int = 128
    num_shared_experts: int = 1
    first_k_dense_replace: int = 1
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    rotary_dim: int | None = None
    partial_rotary_factor: float = 0.5
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    use_qkv_bias: bool = False
    use_bias: bool = False
    block_length: int = BLOCK_LENGTH
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID
    pad_token_id: int = PAD_TOKEN_ID
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ValueError(
                f"head_dim * partial_rotary_factor ({self.head_dim} * {self.partial_rotary_factor} "
                f"= {self.rope_dim} rotated dims) must be even and in (0, head_dim={self.head_dim}]; "
                "fix partial_rotary_factor in config.json"
            )
        if self.rotary_dim is not None and self.rotary_dim != self.rope_dim:
            raise ValueError(
                f"config.json rotary_dim={self.rotary_dim} disagrees with head_dim * "
                f"partial_rotary_factor = {self.head_dim} * {self.partial_rotary_factor} = "
                f"{self.rope_dim}; the release code rotates head_dim * partial_rotary_factor dims "
                "and ignores rotary_dim: make them agree (or drop rotary_dim)"
            )
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError(
                f"num_experts ({self.num_experts}) must divide into n_group ({self.n_group}) groups "
                f"and topk_group ({self.topk_group}) must be <= n_group"
            )
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True is not supported; LLaDA2 releases are untied")

    @property
    def rope_dim(self) -> int:
        """Rotated dims per head: head_dim * partial_rotary_factor (default 0.5), as the release
        code computes it; `rotary_dim` is only checked against it (`__post_init__`)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> LLaDA2Config:
        """Build from a config.json dict; unknown keys are kept in `extra` for round trips."""
        return config_from_hf(cls, raw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (original extra keys preserved)."""
        return config_to_hf(
            self, {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}
        )


class LLaDA2Attention(nn.Module):
    """Fused-QKV GQA attention with per-head q/k RMSNorm and partial RoPE."""

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        width = (self.n_heads + 2 * self.n_kv) * cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, width, bias=cfg.use_qkv_bias)
        self.query_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.dense = nn.Linear(self.n_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.use_bias)

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
        qkv = self.query_key_value(x).view(b, n, self.n_heads + 2 * self.n_kv, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=2)
        q = rotate_heads(q, cos, sin, norm=self.query_layernorm, full_precision=False, kernels=kernels)
        k = rotate_heads(k, cos, sin, norm=self.key_layernorm, full_precision=False, kernels=kernels)
        v = v.transpose(1, 2)
        new_kv = (k, v)
        if past is not None:
            k, v = past.join(k, v)
        att = attend(q, k, v, mask, backend=backend, kernels=kernels).transpose(1, 2).reshape(b, n, -1)
        out: torch.Tensor = self.dense(att)
        return out, new_kv


class LLaDA2DecoderLayer(nn.Module):
    """Pre-norm block; dense MLP for the first `first_k_dense_replace` layers, else MoE."""

    def __init__(self, cfg: LLaDA2Config, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = LLaDA2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module
        if index < cfg.first_k_dense_replace:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            gate = GroupLimitedSigmoidRouter(
                cfg.hidden_size,
                cfg.num_experts,
                cfg.num_experts_per_tok,
                n_group=cfg.n_group,
                topk_group=cfg.topk_group,
                routed_scaling_factor=cfg.routed_scaling_factor,
                norm_topk_prob=cfg.norm_topk_prob,
            )
            self.mlp = SparseMoE(
                gate,
                cfg.hidden_size,
                cfg.moe_intermediate_size,
                cfg.num_experts,
                shared_intermediate=cfg.moe_intermediate_size * cfg.num_shared_experts,
                accumulate_fp32=True,
            )

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
        att, kv = self.attention(h, cos, sin, mask, backend, past, kernels)
        h, x = self.post_attention_layernorm.add_forward(x, att, kernels)
        out: torch.Tensor = x + self.mlp(h, kernels)
        return out, kv


class _Body(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.word_embeddings = FastEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDA2Model(HeadedDiffusionLM):
    """LLaDA2.x block-diffusion LM; `forward` returns fp32 logits [B, L, V] (no shift)."""

    logits_fp32 = True

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.traits = DiffusionTraits(
            family="llada2",
            mask_token_id=cfg.mask_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
            block_length=cfg.block_length,
        )
        self.attention_backend = "sdpa"
        self.gradient_checkpointing = False

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
        cfg = self.config
        mask, position_ids = attention_inputs(
            input_ids, attention_mask, position_ids, past_key_values, cfg.block_length, attention
        )
        cos, sin = rope_cos_sin(position_ids, cfg.rope_dim, cfg.rope_theta)
        x = self.model.word_embeddings(input_ids)
        x, cache = run_layers(
            self, self.model.layers, x, cos, sin, mask, past_key_values, use_cache, attention_mask,
            backend=attention_backend,
        )
        hidden: torch.Tensor = self.model.norm(x, self.kernels)
        return hidden, cache

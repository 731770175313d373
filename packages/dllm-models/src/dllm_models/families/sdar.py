"""SDAR: block diffusion on the Qwen3 layout (per-head q/k RMSNorm before RoPE).

Cheng et al., "SDAR: A Synergistic Diffusion-AutoRegression Paradigm for Scalable Sequence
Generation", arXiv 2510.06303. Attention is block-causal: blocks of `block_size` tokens on the
grid aligned to absolute position 0; a query sees its own block bidirectionally and every earlier
block. Every RMSNorm multiplies by its weight in fp32 and rounds once (flash-attn's Triton
`rms_norm_fn`). Parameter names are transformers' Qwen3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dllm_models.families.hf_config import config_from_hf, config_to_hf
from dllm_models.families.moe import MLP
from dllm_models.families.qwen import QwenAttention, QwenDecoderLayer, QwenStyleLM
from dllm_models.protocol import DiffusionTraits

MASK_TOKEN_ID = 151669
EOS_TOKEN_ID = 151643
PAD_TOKEN_ID = 151643
BLOCK_SIZE = 4


@dataclass(frozen=True)
class SDARConfig:
    """Shape and constants of a dense SDAR model, read from its config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    block_size: int = BLOCK_SIZE
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID
    pad_token_id: int = PAD_TOKEN_ID
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.attention_bias:
            raise ValueError("attention_bias=True is not supported; SDAR releases have no biases")
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True is not supported; SDAR releases are untied")

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> SDARConfig:
        """Build from a config.json dict; unknown keys are kept in `extra` for round trips."""
        return config_from_hf(cls, raw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (original extra keys preserved)."""
        return config_to_hf(self, {"model_type": "sdar", "architectures": ["SDARForCausalLM"]})


def qwen3_attention(cfg: Any) -> QwenAttention:
    """Qwen3 attention of a SDAR-like config: no biases, fp32-scale per-head q/k norms."""
    return QwenAttention(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        qkv_bias=False,
        qk_norm_eps=cfg.rms_norm_eps,
        scale_in_fp32=True,
    )


class SDARModel(QwenStyleLM):
    """Dense SDAR block-diffusion LM; `forward` returns logits [B, L, V] (no shift)."""

    def __init__(self, cfg: SDARConfig) -> None:
        super().__init__(rotary_dim=cfg.head_dim, rope_theta=cfg.rope_theta, block_length=cfg.block_size)
        self.config = cfg

        def layer(_: int) -> QwenDecoderLayer:
            mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
            return QwenDecoderLayer(qwen3_attention(cfg), mlp, cfg.hidden_size, cfg.rms_norm_eps, True)

        self.build(
            vocab=cfg.vocab_size,
            hidden=cfg.hidden_size,
            n_layers=cfg.num_hidden_layers,
            eps=cfg.rms_norm_eps,
            scale_in_fp32=True,
            make_layer=layer,
        )
        self.traits = DiffusionTraits(
            family="sdar",
            mask_token_id=cfg.mask_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
            block_length=cfg.block_size,
        )

"""SDAR-MoE (SDAR-30B-A3B): SDAR block diffusion on the Qwen3-MoE layout.

Every layer is sparse by default (`decoder_sparse_step` 1, `mlp_only_layers` []): a softmax
router over `num_experts` experts picks the top `num_experts_per_tok`, renormalised; no shared
expert. The release config carries neither the mask id nor the block size: the tokenizer's
`<|MASK|>` id and SDAR's block size 4 are the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from dllm_models.families.hf_config import config_from_hf, config_to_hf
from dllm_models.families.moe import MLP, SoftmaxTopKRouter, SparseMoE
from dllm_models.families.qwen import QwenDecoderLayer, QwenStyleLM
from dllm_models.families.sdar import qwen3_attention
from dllm_models.protocol import DiffusionTraits

MASK_TOKEN_ID = 151669
EOS_TOKEN_ID = 151643
PAD_TOKEN_ID = 151643
BLOCK_SIZE = 4


@dataclass(frozen=True)
class SDARMoeConfig:
    """Shape and constants of a SDAR-MoE model, read from its config.json."""

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
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    block_size: int = BLOCK_SIZE
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID
    pad_token_id: int = PAD_TOKEN_ID
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in [1, num_experts "
                f"({self.num_experts})]"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True is not supported; SDAR releases are untied")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer` is an MoE layer (Qwen3-MoE's rule)."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> SDARMoeConfig:
        """Build from a config.json dict; unknown keys are kept in `extra` for round trips."""
        return config_from_hf(cls, raw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (original extra keys preserved)."""
        out = config_to_hf(
            self, {"model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"]}
        )
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        return out


class SDARMoeModel(QwenStyleLM):
    """SDAR-MoE block-diffusion LM; `forward` returns logits [B, L, V] (no shift)."""

    def __init__(self, cfg: SDARMoeConfig) -> None:
        super().__init__(rotary_dim=cfg.head_dim, rope_theta=cfg.rope_theta, block_length=cfg.block_size)
        self.config = cfg

        def layer(i: int) -> QwenDecoderLayer:
            mlp: nn.Module
            if cfg.is_sparse(i):
                gate = SoftmaxTopKRouter(
                    cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                    norm_topk_prob=cfg.norm_topk_prob,
                )
                mlp = SparseMoE(gate, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts)
            else:
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
            family="sdar_moe",
            mask_token_id=cfg.mask_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
            block_length=cfg.block_size,
        )

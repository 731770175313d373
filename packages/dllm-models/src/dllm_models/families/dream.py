"""Dream: a bidirectional masked-diffusion LM on the Qwen2 layout, read with a shift of one.

Ye et al., "Dream 7B: Diffusion Large Language Models", arXiv 2508.15487. Parameter names are
transformers' Qwen2 (q/k/v biases, GQA). The prediction for position j is read from the logits
at j - 1 (`traits.logit_shift == 1`); `forward` returns the raw, unshifted logits.

Deliberate difference from the release: its forward ignores `position_ids` and always counts
positions from 0, so left padding shifts positions; here positions default to counting from each
row's first real token and explicit `position_ids` are honoured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dllm_models.families.hf_config import config_from_hf, config_to_hf
from dllm_models.families.moe import MLP
from dllm_models.families.qwen import QwenAttention, QwenDecoderLayer, QwenStyleLM
from dllm_models.protocol import DiffusionTraits

MASK_TOKEN_ID = 151666
EOS_TOKEN_ID = 151643
PAD_TOKEN_ID = 151643


@dataclass(frozen=True)
class DreamConfig:
    """Shape and constants of a Dream model, read from its config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 131072
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID
    pad_token_id: int = PAD_TOKEN_ID
    tie_word_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.tie_word_embeddings:
            raise ValueError("tie_word_embeddings=True is not supported; Dream releases are untied")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> DreamConfig:
        """Build from a config.json dict; unknown keys are kept in `extra` for round trips."""
        return config_from_hf(cls, raw)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (original extra keys preserved)."""
        return config_to_hf(self, {"model_type": "Dream", "architectures": ["DreamModel"]})


class DreamModel(QwenStyleLM):
    """Dream masked-diffusion LM; `forward` returns raw logits [B, L, V] (shift on read)."""

    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__(rotary_dim=cfg.head_dim, rope_theta=cfg.rope_theta, block_length=None)
        self.config = cfg

        def layer(_: int) -> QwenDecoderLayer:
            attn = QwenAttention(
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                qkv_bias=True,
                qk_norm_eps=None,
                scale_in_fp32=False,
            )
            mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
            return QwenDecoderLayer(attn, mlp, cfg.hidden_size, cfg.rms_norm_eps, False)

        self.build(
            vocab=cfg.vocab_size,
            hidden=cfg.hidden_size,
            n_layers=cfg.num_hidden_layers,
            eps=cfg.rms_norm_eps,
            scale_in_fp32=False,
            make_layer=layer,
        )
        self.traits = DiffusionTraits(
            family="dream",
            mask_token_id=cfg.mask_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
            block_length=None,
            logit_shift=1,
        )

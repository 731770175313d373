"""LLaDA: a bidirectional masked-diffusion transformer with OLMo-style parameter names.

Nie et al., "Large Language Diffusion Models", arXiv 2502.09992. Parameter names match the
released HF checkpoint (`model.transformer.blocks.{i}.q_proj.weight`, ...), so its safetensors load
as they are, with no remote code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from dllm_models.attention import AttentionMask, attend
from dllm_models.families.backbone import HeadedDiffusionLM, attention_inputs, run_layers
from dllm_models.layers import PLAIN, FastEmbedding, KernelConfig, RMSNorm, rope_cos_sin, rotate_heads, swiglu
from dllm_models.protocol import DiffusionTraits, KVCache, LayerPast

MASK_TOKEN_ID = 126336
EOS_TOKEN_ID = 126081


@dataclass(frozen=True)
class LLaDAConfig:
    """Shape and constants of a LLaDA model, read from its config.json."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden_size: int
    vocab_size: int
    embedding_size: int
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    mask_token_id: int = MASK_TOKEN_ID
    eos_token_id: int = EOS_TOKEN_ID
    pad_token_id: int = EOS_TOKEN_ID
    rope_full_precision: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.embedding_size < self.vocab_size:
            raise ValueError(
                f"embedding_size ({self.embedding_size}) must be >= vocab_size ({self.vocab_size})"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> LLaDAConfig:
        """Build from a config.json dict; unknown keys are kept in `extra` for round trips."""
        names = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: raw[k] for k in names if k in raw and raw[k] is not None}
        kwargs.setdefault("n_kv_heads", raw.get("n_heads"))
        kwargs.setdefault("embedding_size", raw.get("vocab_size"))
        extra = {k: v for k, v in raw.items() if k not in names}
        return cls(**kwargs, extra=extra)

    def to_hf(self) -> dict[str, Any]:
        """The config.json dict (original extra keys preserved)."""
        out = dict(self.extra)
        out.update({k: v for k, v in asdict(self).items() if k != "extra"})
        out.setdefault("model_type", "llada")
        out.setdefault("architectures", ["LLaDAModelLM"])
        out.setdefault("weight_tying", False)
        return out


class LLaDABlock(nn.Module):
    """One pre-norm transformer block with OLMo/LLaDA parameter names."""

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=False)
        self.attn_out = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, cfg.d_model, bias=False)

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
        hd = self.cfg.head_dim
        h = self.attn_norm(x, kernels)
        fp = self.cfg.rope_full_precision
        q = rotate_heads(self.q_proj(h).view(b, n, -1, hd), cos, sin, norm=None, full_precision=fp, kernels=kernels)
        k = rotate_heads(self.k_proj(h).view(b, n, -1, hd), cos, sin, norm=None, full_precision=fp, kernels=kernels)
        v = self.v_proj(h).view(b, n, -1, hd).transpose(1, 2)
        new_kv = (k, v)
        if past is not None:
            k, v = past.join(k, v)
        att = attend(q, k, v, mask, backend=backend, kernels=kernels).transpose(1, 2).reshape(b, n, -1)
        h, x = self.ff_norm.add_forward(x, self.attn_out(att), kernels)
        out: torch.Tensor = x + self.ff_out(swiglu(self.ff_proj(h), self.up_proj(h), kernels))
        return out, new_kv


class _Transformer(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.wte = FastEmbedding(cfg.embedding_size, cfg.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ff_out = nn.Linear(cfg.d_model, cfg.embedding_size, bias=False)


class _Inner(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.transformer = _Transformer(cfg)


class LLaDAModel(HeadedDiffusionLM):
    """LLaDA masked-diffusion LM; `forward` returns raw logits [B, L, V]."""

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Inner(cfg)
        self.traits = DiffusionTraits(
            family="llada",
            mask_token_id=cfg.mask_token_id,
            eos_token_id=cfg.eos_token_id,
            pad_token_id=cfg.pad_token_id,
        )
        self.attention_backend = "sdpa"
        self.gradient_checkpointing = False

    def get_output_embeddings(self) -> nn.Linear:
        """The LM head `model.transformer.ff_out` ([V, H] weight)."""
        return self.model.transformer.ff_out

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
        """(final hidden states [B, L, H] after `ln_f`, KVCache of this call or None)."""
        t = self.model.transformer
        mask, position_ids = attention_inputs(
            input_ids, attention_mask, position_ids, past_key_values, None, attention
        )
        cos, sin = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        x = t.wte(input_ids)
        x, cache = run_layers(
            self, t.blocks, x, cos, sin, mask, past_key_values, use_cache, attention_mask,
            backend=attention_backend,
        )
        hidden: torch.Tensor = t.ln_f(x, self.kernels)
        return hidden, cache

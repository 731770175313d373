"""What every diffusion LM family shares: its traits, its KV cache and its output type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def is_token_id(value: object) -> bool:
    """Whether `value` is a token id: an int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class DiffusionTraits:
    """Constants of a diffusion LM that samplers and trainers need.

    Attributes:
        family: canonical family name (`dllm_models.registry.FAMILIES`: llada, dream, sdar,
            sdar_moe, llada2); config.json `model_type` spellings map to it (`MODEL_TYPES`).
        mask_token_id: id of the mask token that noised positions carry.
        eos_token_id: end-of-sequence id: the sampler stops on it and fills what a response
            leaves masked with it.
        pad_token_id: id used to pad batches.
        block_length: native block size of block-diffusion models; None for masked diffusion.
        logit_shift: 1 if the prediction for position j is read at j - 1 (Dream), else 0.
        stop_token_ids: further ids that end a response, as the release's generation_config.json
            lists them beside the EOS (SDAR chat models: `<|im_end|>` 151645 before
            `<|endoftext|>` 151643); `load_model` reads them. Samplers, response masks and
            engines use `stop_ids`.
    """

    family: str
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    block_length: int | None = None
    logit_shift: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.stop_token_ids, tuple) or not all(map(is_token_id, self.stop_token_ids)):
            raise ValueError(f"stop_token_ids must be a tuple of token ids >= 0, got {self.stop_token_ids!r}")
        if self.logit_shift not in (0, 1):
            raise ValueError(f"logit_shift must be 0 or 1, got {self.logit_shift}")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError(f"block_length must be >= 1 or None, got {self.block_length}")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Every id that ends a response: the EOS first, then `stop_token_ids` (no repeats)."""
        return (self.eos_token_id, *dict.fromkeys(t for t in self.stop_token_ids if t != self.eos_token_id))


@dataclass
class KVCache:
    """Per-layer keys and values of cached positions (keys already rotated by RoPE).

    Two ways to use it:

    - appended (default): a forward's queries attend to the cached positions followed by their own
      keys (one `torch.cat` per layer); for block-causal models every query sees every cached key.
    - written in place (`write_columns` set): the tensors span a whole canvas of W columns; a
      forward writes its own keys/values into columns `write_columns` of every layer (in place,
      no allocation) and its queries attend over all W columns, seeing exactly the columns marked
      in `key_padding` (the caller marks them: for block diffusion the finished blocks and the
      call's own block). Every call then has the same shapes, which CUDA graphs need. A call may
      cover several blocks (a finished block and the next one): `key_limit` then keeps each
      query block-causal.

    Attributes:
        keys, values: one [B, Hkv, Lc, D] tensor per layer.
        key_padding: bool [B, Lc], True on real cached positions (None: all real). With
            `write_columns`, the visibility of every column to every query of the call.
        write_columns: long [n] canvas columns of the call's n positions (in-place mode), or None.
        key_limit: long [n] (in-place mode): the call's query i sees only columns < key_limit[i]
            (in addition to key_padding); None: every visible column.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_padding: torch.Tensor | None = None
    write_columns: torch.Tensor | None = None
    key_limit: torch.Tensor | None = None

    def layer(self, i: int) -> LayerPast:
        """What layer `i` attends to in addition to its own keys."""
        return LayerPast(self.keys[i], self.values[i], self.write_columns)

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    def slice(self, start: int, end: int | None = None) -> KVCache:
        """Cached positions [start, end) of every layer."""
        kp = None if self.key_padding is None else self.key_padding[:, start:end]
        return KVCache(
            [k[:, :, start:end] for k in self.keys], [v[:, :, start:end] for v in self.values], kp
        )

    def cat(self, other: KVCache) -> KVCache:
        """This cache followed by `other` along the sequence axis."""
        kp = None
        if self.key_padding is not None or other.key_padding is not None:
            mine = self.key_padding if self.key_padding is not None else _ones(self)
            theirs = other.key_padding if other.key_padding is not None else _ones(other)
            kp = torch.cat([mine, theirs], dim=1)
        return KVCache(
            [torch.cat([a, b], dim=2) for a, b in zip(self.keys, other.keys)],
            [torch.cat([a, b], dim=2) for a, b in zip(self.values, other.values)],
            kp,
        )


@dataclass(frozen=True)
class LayerPast:
    """One layer's share of a `KVCache` (see there for the two modes)."""

    keys: torch.Tensor
    values: torch.Tensor
    write_columns: torch.Tensor | None = None

    def join(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys/values a call with own keys `k`, values `v` [B, Hkv, n, D] attends over."""
        if self.write_columns is None:
            return torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        # (one column per position: checked once per forward by `attention_inputs`)
        self.keys.index_copy_(2, self.write_columns, k.to(self.keys.dtype))
        self.values.index_copy_(2, self.write_columns, v.to(self.values.dtype))
        return self.keys, self.values


def _ones(cache: KVCache) -> torch.Tensor:
    k = cache.keys[0]
    return torch.ones((k.shape[0], k.shape[2]), dtype=torch.bool, device=k.device)


@dataclass
class ModelOutput:
    """What a forward pass returns.

    Attributes:
        logits: [B, L, V] raw logits before any family-specific shift.
        past_key_values: the KV cache after this call, when one was requested.
    """

    logits: torch.Tensor
    past_key_values: Any = None

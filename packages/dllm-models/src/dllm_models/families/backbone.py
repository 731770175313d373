"""The backbone every family shares: attention inputs, the layer loop, random init and the output head
(`HeadedDiffusionLM`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dllm_models.activation_memory import planner_of
from dllm_models.attention import AttentionMask
from dllm_models.layers import DEFAULT_KERNELS, KernelConfig, positions_from_mask
from dllm_models.protocol import KVCache, ModelOutput

def positions_from_attention(attention: AttentionMask, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """Default position ids [B, L] of an explicit attention mask over L positions.

    Packed rows (`cu_seqlens`) count from 0 in every sequence; in the BD3LM layout (`is_clean`)
    the noisy and the clean copy of a sample each count from 0 (duplicated positions), and so does
    every noisy copy of the shared-clean layout (`copy_ids`). Without either, positions are
    0..L-1 (key padding, when present, is only a visibility rule here).
    """
    idx = torch.arange(length, device=device)
    seg = attention.segment_ids(device)
    if seg is None and attention.is_clean is None:
        return idx[None].expand(batch, -1)
    # runs of constant (sequence, clean copy, noisy copy): a position counts from the start of its run
    start = torch.ones((batch, length), dtype=torch.bool, device=device)
    changed = torch.zeros((batch, max(length - 1, 0)), dtype=torch.bool, device=device)
    if seg is not None:
        if seg.numel() < length:
            raise ValueError(f"cu_seqlens cover {seg.numel()} positions, the input has {length}")
        s = seg[-length:][None]
        changed = changed | (s[:, 1:] != s[:, :-1])
    for part in (attention.is_clean, attention.copy_ids):
        if part is not None:
            x = part[:, -length:].to(device=device, dtype=torch.long)
            changed = changed | (x[:, 1:] != x[:, :-1])
    start[:, 1:] = changed
    first = torch.where(start, idx[None].expand(batch, -1), torch.zeros_like(idx)[None])
    return idx[None] - first.cummax(dim=1).values


def attention_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past_key_values: KVCache | None,
    block_length: int | None,
    attention: AttentionMask | None = None,
) -> tuple[AttentionMask, torch.Tensor]:
    """The attention mask spec and position ids of a forward call.

    Block-diffusion families (`block_length` set) number blocks on the global grid from absolute
    position 0: block id = position_ids // block_length. Cached keys precede the current call, so
    they get the smallest block id of the row's queries: every query sees all cached keys.

    An explicit `attention` replaces the mask built from `attention_mask`: packed rows
    (`cu_seqlens`, B = 1), the BD3LM layout (`attention.bd3lm_mask`) or any other spec. When it
    carries no `block_ids` and the family is block-causal, block ids are added from the
    per-sequence positions (global grid of each packed sequence; sequences never see each other).

    Args:
        input_ids: [B, L].
        attention_mask: [B, L] 1/True on real tokens, or None.
        position_ids: [B, L] or None (then counted from each row's first real token, or from
            each packed sequence's start with an explicit packed `attention`).
        past_key_values: cache of Lc earlier positions, or None.
        block_length: block size of block-causal attention; None for bidirectional.
        attention: explicit mask over Lc + L keys, or None.

    Returns:
        (AttentionMask over Lc + L keys, position_ids [B, L]).
    """
    if past_key_values is not None and past_key_values.write_columns is not None:
        return _in_place_inputs(input_ids, attention_mask, position_ids, past_key_values, attention)
    if attention is not None:
        return _explicit_inputs(input_ids, position_ids, past_key_values, block_length, attention)
    b, n = input_ids.shape
    device = input_ids.device
    key_padding = None
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        key_padding = attention_mask.bool()
    if past_key_values is not None:
        if position_ids is None:
            raise ValueError("position_ids are required when past_key_values is given")
        if key_padding is not None or past_key_values.key_padding is not None:
            own = (
                attention_mask.bool()
                if attention_mask is not None
                else torch.ones((b, n), dtype=torch.bool, device=device)
            )
            cached = past_key_values.key_padding
            if cached is None:
                cached = torch.ones((b, past_key_values.length), dtype=torch.bool, device=device)
            key_padding = torch.cat([cached.to(device), own], dim=1)
    if position_ids is None:
        if attention_mask is None:
            position_ids = torch.arange(n, device=device)[None].expand(b, -1)
        else:
            position_ids = positions_from_mask(attention_mask)
    block_ids = None
    if block_length is not None:
        block_ids = torch.div(position_ids, block_length, rounding_mode="floor")
        if past_key_values is not None and past_key_values.length:
            first = block_ids.min(dim=1, keepdim=True).values
            block_ids = torch.cat([first.expand(b, past_key_values.length), block_ids], dim=1)
    return AttentionMask(key_padding=key_padding, block_ids=block_ids), position_ids


def _in_place_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    past_key_values: KVCache,
    attention: AttentionMask | None,
) -> tuple[AttentionMask, torch.Tensor]:
    """A call that writes into a canvas-wide cache: visibility is the cache's key padding alone."""
    if position_ids is None:
        raise ValueError("position_ids are required when past_key_values is given")
    if attention is not None or attention_mask is not None:
        raise ValueError(
            "a KVCache with write_columns defines visibility through its key_padding alone: pass no "
            "attention_mask/attention, mark the visible columns in past_key_values.key_padding instead"
        )
    assert past_key_values.write_columns is not None
    if past_key_values.write_columns.numel() != input_ids.shape[1]:
        raise ValueError(
            f"KVCache.write_columns has {past_key_values.write_columns.numel()} columns, input_ids has "
            f"{input_ids.shape[1]} positions: list one canvas column per input position"
        )
    limit = past_key_values.key_limit
    if limit is not None and limit.numel() != input_ids.shape[1]:
        raise ValueError(
            f"KVCache.key_limit has {limit.numel()} entries, input_ids has {input_ids.shape[1]} positions: "
            "give one key limit per input position"
        )
    return AttentionMask(key_padding=past_key_values.key_padding, key_limit=limit), position_ids


def _explicit_inputs(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None,
    past_key_values: KVCache | None,
    block_length: int | None,
    attention: AttentionMask,
) -> tuple[AttentionMask, torch.Tensor]:
    b, n = input_ids.shape
    cached = past_key_values.length if past_key_values is not None else 0
    if attention.cu_seqlens is not None:
        if b != 1:
            raise ValueError(f"packed input (attention.cu_seqlens) must have batch size 1, got {b}")
        total = int(attention.cu_seqlens[-1])
        if total != cached + n:
            raise ValueError(
                f"attention.cu_seqlens cover {total} positions, the call has {cached} cached + {n}"
            )
    if position_ids is None:
        if cached:
            raise ValueError("position_ids are required when past_key_values is given")
        position_ids = positions_from_attention(attention, b, n, input_ids.device)
        _check_counted_positions(attention, position_ids, block_length)
    if block_length is None or attention.block_ids is not None:
        return attention, position_ids
    if cached:
        raise ValueError(
            "an explicit attention mask with a KV cache must carry block_ids for a block-causal "
            "family (the cached keys' blocks are unknown)"
        )
    blocks = torch.div(position_ids, block_length, rounding_mode="floor")
    mask = AttentionMask(
        key_padding=attention.key_padding, block_ids=blocks,
        cu_seqlens=attention.cu_seqlens, max_seqlen=attention.max_seqlen,
    )
    return mask, position_ids


def _check_counted_positions(attention: AttentionMask, position_ids: torch.Tensor, block_length: int | None) -> None:
    """Refuse positions counted from the runs of a BD3LM mask whose block ids they contradict: a
    layout with dropped positions (`bd3lm_mask(keep=...)`) needs explicit position ids."""
    if block_length is None or attention.is_clean is None or attention.block_ids is None:
        return
    blocks = attention.block_ids[:, -position_ids.shape[1]:].to(position_ids.device)
    if not bool((torch.div(position_ids, block_length, rounding_mode="floor") == blocks).all()):
        raise ValueError(
            "position_ids=None: the positions counted from the runs of this BD3LM attention mask contradict its "
            f"block_ids (block_length {block_length}); a layout with dropped positions (bd3lm_mask(keep=...)) "
            "needs explicit position_ids, the position of each kept token in its sequence"
        )


def run_layers(
    model: nn.Module,
    layers: nn.ModuleList,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: AttentionMask,
    past_key_values: KVCache | None,
    use_cache: bool,
    attention_mask: torch.Tensor | None,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, KVCache | None]:
    """Run the decoder stack, with gradient checkpointing when the model asks for it.

    With `model.activation_planner` (`dllm_models.activation_memory`) a checkpointed training
    forward recomputes only as many layers as its memory budget needs; without it, every layer.

    Every layer is called as `layer(x, cos, sin, mask, backend, past, kernels)`, with `backend`
    (None: the model's `attention_backend`) and the model's `kernels` (a `KernelConfig`).

    Returns:
        hidden states [B, L, H] and, with use_cache, the KVCache of this call's positions
        (post-RoPE keys; not including `past_key_values`).
    """
    backend = backend or str(getattr(model, "attention_backend", "sdpa"))
    ckpt = bool(getattr(model, "gradient_checkpointing", False)) and model.training
    kernels: KernelConfig = getattr(model, "kernels", DEFAULT_KERNELS)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []

    def call(i: int, x: torch.Tensor, recompute: bool) -> tuple[torch.Tensor, Any]:
        layer, past = layers[i], past_key_values.layer(i) if past_key_values is not None else None
        if recompute:
            return checkpoint(layer, x, cos, sin, mask, backend, past, kernels, use_reentrant=False)  # type: ignore[no-any-return]
        return layer(x, cos, sin, mask, backend, past, kernels)  # type: ignore[no-any-return]

    planner = planner_of(model) if ckpt else None
    if planner is not None:  # checkpoint only as many layers as the memory budget needs
        x, kvs = planner.run(list(layers), x, call)
    else:
        kvs = []
        for i in range(len(layers)):
            x, kv = call(i, x, ckpt)
            kvs.append(kv)
    if use_cache:
        keys = [kv[0] for kv in kvs]
        values = [kv[1] for kv in kvs]
    if not use_cache:
        return x, None
    own_padding = attention_mask.bool() if attention_mask is not None else None
    return x, KVCache(keys, values, own_padding)


def reset_parameters(module: nn.Module, generator: torch.Generator | None, std: float) -> None:
    """Normal(0, std) weights and biases, unit norm scales, zero buffers (e.g. `expert_bias`)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("norm.weight", "ln_f.weight")):
                p.fill_(1.0)
            else:
                dev = generator.device if generator is not None else p.device
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32, device=dev) * std)
        for _, buf in module.named_buffers():
            if buf.is_floating_point():
                buf.zero_()


class HeadedDiffusionLM(nn.Module):
    """What every family shares on top of its own `hidden_states`: the output head.

    Subclasses implement `hidden_states(...) -> (hidden [B, L, H], cache)` and
    `get_output_embeddings()`; `final_hidden` and `forward` are defined once here, so the fused
    log-prob path (`final_hidden` + the head's weight) and the logits path cannot drift apart.

    Attributes:
        logits_fp32: upcast logits to float32 (LLaDA2's release does).
        kernels: how the forward runs (`KernelConfig`: fused elementwise kernels, the decode
            attention kernel and its tuning, flex tiles; every kernel on by default). Set it from
            the run's config (`model.kernels = KernelConfig(...)`, the app's `kernels` section); it
            is passed down every forward to the layers and the attention calls.
    """

    logits_fp32: bool = False
    kernels: KernelConfig = DEFAULT_KERNELS

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
        raise NotImplementedError

    def get_output_embeddings(self) -> nn.Linear:
        raise NotImplementedError

    def reset_parameters(self, generator: torch.Generator | None = None, std: float = 0.02) -> None:
        """Fresh normal(0, std) weights, unit norms, zero float buffers (random-weight builds, tests)."""
        reset_parameters(self, generator, std)

    def final_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        attention: AttentionMask | None = None,
        past_key_values: KVCache | None = None,
        attention_backend: str | None = None,
    ) -> torch.Tensor:
        """Hidden states [B, L, H] after the final norm, before the LM head (see `forward`)."""
        hidden, _ = self.hidden_states(
            input_ids, attention_mask, position_ids, past_key_values=past_key_values, attention=attention,
            attention_backend=attention_backend,
        )
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        attention: AttentionMask | None = None,
        attention_backend: str | None = None,
        logit_columns: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Forward over a padded or packed batch, optionally attending to a KV cache.

        Args:
            input_ids: [B, L] token ids.
            attention_mask: [B, L], 1/True for real tokens (keys with 0 are never attended).
                With a cache, the cache's own `key_padding` covers the cached keys.
            position_ids: [B, L]; defaults to positions counted from each row's first real token
                (from each sequence's start with a packed `attention`; required with a cache).
            past_key_values: cached keys/values the queries attend to in addition to their own.
            use_cache: return this call's keys/values as `past_key_values`.
            attention: explicit mask replacing the one built from `attention_mask`, e.g. packed
                rows `AttentionMask(cu_seqlens=..., max_seqlen=...)` on a [1, T] input, or the
                BD3LM [x_t ; x_0] layout of block families.
            attention_backend: a key of `dllm_models.attention.BACKENDS` for this call (None: the
                model's `attention_backend`), e.g. a packed backend for training scores.
            logit_columns: long [n] sequence columns the head runs on (None: all): the logits
                are then [B, n, V], column i the raw logits of position `logit_columns[i]`; the
                hidden states are those of the whole forward, so they are the same function.

        Returns:
            ModelOutput with raw logits [B, L, V] (before any family-specific shift; [B, n, V]
            with `logit_columns`) and, with use_cache, the KVCache of this call's positions (not
            including `past_key_values`).
        """
        hidden, cache = self.hidden_states(
            input_ids, attention_mask, position_ids,
            past_key_values=past_key_values, use_cache=use_cache, attention=attention,
            attention_backend=attention_backend,
        )
        if logit_columns is not None:
            hidden = hidden.index_select(1, logit_columns)
        logits = self.get_output_embeddings()(hidden)
        return ModelOutput(logits=logits.float() if self.logits_fp32 else logits, past_key_values=cache)

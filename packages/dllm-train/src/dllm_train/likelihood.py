"""Running a model on noised inputs and reading aligned token log-probs.

`Scorer` is the one place that knows how a family is run for a likelihood: the logit shift
(Dream reads position j's logit at j - 1) and, for block-diffusion families (SDAR, LLaDA2), the
BD3LM [x_t ; x_0] layout (Arriola et al., arXiv 2503.09573): a noisy block sees itself and the
clean earlier blocks only. Objectives receive a `Scorer` and never branch on the family.
A scorer built with a packed `attention` backend scores packed rows with the fused log-prob head
(`dllm_train.packed_scoring`); otherwise the padded batch, whose head runs on chunks of at most
`dllm_models.logprob.LOGITS_CHUNK_ELEMENTS` logits (recomputed in backward), so no pass holds
[tokens, vocabulary] logits. How many rows one forward takes is decided above it
(`dllm_train.passes`): `row_cost` says what each row costs a forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from dllm_models.layers import positions_from_mask
from dllm_models.logprob import LOGITS_CHUNK_ELEMENTS
from dllm_objectives import MaskPlan, apply_mask, token_logp_from_logits
from dllm_train.packed_scoring import PACKED_BACKENDS, Readout, noised_block_counts, packed_token_logp, shares_clean_context
from dllm_train.passes import ValuesScorer


def logp_of_targets(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 log-probs of `targets` ([M, S] or [M, S, C]) under logits [M, S, V]."""
    if targets.dim() == logits.dim() - 1:
        return token_logp_from_logits(logits, targets, temperature=temperature)
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)
    return logp.gather(-1, targets)


def chunked_head_logp(model: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                      chunk_tokens: int) -> torch.Tensor:
    """`logp_of_targets(head(hidden), targets)` over chunks of `chunk_tokens` tokens, never all logits at once.

    Each chunk runs the model's output head (as `forward` does: `logits_fp32` upcasts) and the
    float32 log-softmax of its tokens only; under grad the chunk is recomputed in backward
    (`torch.utils.checkpoint`), so forward and backward hold one chunk's logits at a time.
    Values are those of the unchunked computation, row by row; gradients equal it up to the order
    in which the chunks' head-weight gradients are summed.

    Args:
        model: the family module (its `output_head` and `logits_fp32`).
        hidden: [M, S, H] hidden states, already aligned with the targets (logit shift applied).
        targets: long [M, S] (or [M, S, C] candidates).
        temperature: divides the logits.
        chunk_tokens: tokens per chunk.

    Returns:
        float32 [M, S] (or [M, S, C]).
    """
    from dllm_models.logprob import output_head

    head = output_head(model)
    upcast = bool(getattr(model, "logits_fp32", False))
    m, s, h = hidden.shape
    flat_h = hidden.reshape(m * s, h)
    flat_t = targets.reshape(m * s, *targets.shape[2:])

    def piece(h_chunk: torch.Tensor, t_chunk: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = head(h_chunk)
        return logp_of_targets(logits.float() if upcast else logits, t_chunk, temperature)

    outs = []
    for start in range(0, m * s, chunk_tokens):
        h_chunk, t_chunk = flat_h[start:start + chunk_tokens], flat_t[start:start + chunk_tokens]
        if torch.is_grad_enabled():
            out = checkpoint(piece, h_chunk, t_chunk, use_reentrant=False)
            assert isinstance(out, torch.Tensor)
        else:
            out = piece(h_chunk, t_chunk)
        outs.append(out)
    return torch.cat(outs).view(targets.shape)


class Scorer:
    """`score(noisy_ids, attention_mask, targets) -> token_logp` for one model.

    Every call runs exactly one forward of the model, whatever the data (see `lockstep_group`).

    Attributes:
        model: a dllm_models family module.
        mask_id, eos_id, pad_id: the family's special token ids.
        block_length: block size of block-diffusion families (None: bidirectional masked LM).
        lockstep_group: the process group whose ranks must run the same number of forward
            passes because each forward is a collective (an FSDP2-sharded model: every forward
            all-gathers its weights); None: no such group (one process). Objectives with a
            data-dependent number of passes pad to the group's count (`dllm_train.lockstep`).
        attention: the packed attention backend of its forwards ('varlen', 'flex', 'sdpa', ...;
            see `dllm_train.packed_scoring`), or None for the padded batch.
        shared_context: block families on packed rows: consecutive rows with the same clean
            sequence (Monte-Carlo copies) share one clean half of the BD3LM layout; False: one
            clean half per row (the doubled layout, for comparison). The same values either way.
        logits_chunk_tokens: tokens per chunk of the padded path's head (None: as many as
            `LOGITS_CHUNK_ELEMENTS` logits allow at the model's vocabulary).
        noised_only: block families: log-probs only at the noised positions (input differs
            from the clean sequence), 0 at the others, where no objective reads them (the ELBO
            and the policy losses weigh masked tokens only); on packed rows the output head then
            runs on those positions alone. False: every position of a noised block.
    """

    def __init__(self, model: Any, *, lockstep_group: dist.ProcessGroup | None = None,
                 attention: str | None = None, shared_context: bool = True,
                 logits_chunk_tokens: int | None = None, noised_only: bool = True) -> None:
        if attention is not None and attention not in PACKED_BACKENDS:
            raise ValueError(f"training attention {attention!r} is not a packed backend; choose one of {PACKED_BACKENDS}")
        if logits_chunk_tokens is not None and logits_chunk_tokens < 1:
            raise ValueError(f"logits_chunk_tokens must be >= 1 (or None), got {logits_chunk_tokens}")
        self.model = model
        self.lockstep_group = lockstep_group
        self.attention = attention
        self.shared_context = shared_context
        self.logits_chunk_tokens = logits_chunk_tokens
        self.noised_only = noised_only
        traits = model.traits
        self.mask_id: int = int(traits.mask_token_id)
        self.eos_id: int = int(traits.eos_token_id)
        self.pad_id: int = int(traits.pad_token_id)
        self.block_length: int | None = traits.block_length
        self.logit_shift: int = int(traits.logit_shift or 0)

    @property
    def value_dtype(self) -> torch.dtype:
        """dtype of the log-probs a call returns: float32, or float64 for a float64 model."""
        dtype = next(self.model.parameters()).dtype
        return torch.promote_types(dtype, torch.float32)

    def _logits(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(ids, attention_mask=attn, position_ids=pos).logits
        if self.logit_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def _chunk_tokens(self) -> int:
        if self.logits_chunk_tokens is not None:
            return self.logits_chunk_tokens
        from dllm_models.logprob import output_head

        head = output_head(self.model)
        vocab = getattr(head, "out_features", None)
        if vocab is None:
            weight = getattr(head, "weight", None)
            assert isinstance(weight, torch.Tensor), f"output head {type(head).__name__} has no weight"
            vocab = weight.shape[0]
        return max(1, LOGITS_CHUNK_ELEMENTS // int(vocab))

    def _token_logp(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
        """The one forward of a score: float32 log-probs of `targets` [M, S] (or [M, S, C]).

        A forward of more than `_chunk_tokens()` tokens runs the head chunk by chunk
        (`chunked_head_logp`); a smaller one computes its logits in one piece.
        Subclasses change how the forward runs (e.g. sequence parallelism), not what it computes.
        """
        chunk = self._chunk_tokens()
        if ids.numel() <= chunk:
            return logp_of_targets(self._logits(ids, attn, pos), targets, temperature)
        from dllm_models import final_hidden

        hidden = final_hidden(self.model, ids, attention_mask=attn, position_ids=pos)
        if self.logit_shift:
            hidden = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)
        return chunked_head_logp(self.model, hidden, targets, temperature, chunk)

    def idle_pass(self) -> torch.Tensor:
        """One forward of a one-token input (the mask token), returned as a scalar 0 that keeps its graph.

        A rank runs it in place of a pass it does not need, so that the ranks of its
        `lockstep_group` run the same collectives (`dllm_train.lockstep`); backpropagating the
        returned value runs the backward's collectives and adds exactly zero to every gradient.
        """
        device = next(self.model.parameters()).device
        ids = torch.full((1, 1), self.mask_id, dtype=torch.long, device=device)
        attn = torch.ones((1, 1), dtype=torch.bool, device=device)
        lp = self._token_logp(ids, attn, torch.zeros_like(ids), ids, 1.0)
        return lp.sum() * 0.0

    def __call__(
        self,
        noisy_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        *,
        clean_ids: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-prob of `targets` at every position given the noisy input.

        Args:
            noisy_ids: [M, S] model input (mask id at noised positions).
            attention_mask: [M, S] bool, real tokens.
            targets: [M, S] (or [M, S, C] candidate tokens) to score.
            clean_ids: [M, S] clean context of block models (default `targets`).
            temperature: divides the logits (1 for every learner but the exact-order AR one).

        Returns:
            float32 [M, S] (or [M, S, C]). Block models: 0 in the blocks of a row that hold no
            noised token of that row (so a row's values never depend on the other rows), and
            with `noised_only` at every position whose input is not noised.
        """
        attn = attention_mask.bool()
        backend = self.attention
        if backend is not None and targets.dim() == noisy_ids.dim():
            return packed_token_logp(
                self.model, noisy_ids, attn, targets, targets if clean_ids is None else clean_ids,
                temperature=temperature, block_length=self.block_length, backend=backend,
                shared=self.shared_context, noised_only=self.noised_only, readout=self.packed_readout(),
            )
        pos = positions_from_mask(attn)
        if self.block_length is None:
            return self._token_logp(noisy_ids, attn, pos, targets, temperature)
        clean = targets if clean_ids is None else clean_ids
        return self._bd3lm(noisy_ids, attn, pos, clean, targets, temperature)

    def packed_readout(self) -> Readout | None:
        """What a packed forward returns per position (`dllm_train.packed_scoring.Readout`); None: the
        log-probs of the targets (the fused head). A value model's scorer returns its values."""
        return None

    def row_cost(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                 clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[M] tokens one forward runs for each row (what a token budget counts).

        Packed rows: the row's real tokens; for the BD3LM layout of block families its clean copy
        plus the tokens of its noisy copy's noised blocks (`packed_scoring.bd3lm_layout` leaves
        the others out), or twice the real tokens when `clean_ids` is not given (an upper
        bound). Padded rows: the batch width (times the number of the row's noised blocks for
        block families, which run one row per noised block).
        """
        attn = attention_mask.bool()
        if self.attention is not None:
            real = attn.sum(-1)
            if self.block_length is None:
                return real
            if clean_ids is None:
                return real * 2
            return real + noised_block_counts(noisy_ids, attn, clean_ids, self.block_length)
        width = torch.full((attn.shape[0],), attn.shape[1], dtype=torch.long, device=attn.device)
        if self.block_length is None:
            return width
        pos = positions_from_mask(attn)
        bid = torch.where(attn, torch.div(pos, self.block_length, rounding_mode="floor"), -1)
        changed = (noisy_ids != (noisy_ids if clean_ids is None else clean_ids)) & attn
        nblocks = int(bid.max().clamp(min=0)) + 1
        hit = torch.zeros(attn.shape[0], nblocks, dtype=torch.bool, device=attn.device)
        rows = torch.arange(attn.shape[0], device=attn.device)[:, None].expand_as(bid)
        hit[rows[changed], bid[changed]] = True
        return width * hit.sum(-1).clamp(min=1)

    def shared_tokens(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                      clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[M] tokens of row i's `row_cost` that row i - 1 already runs when both are in one forward.

        The clean half of the BD3LM layout that consecutive rows of one clean sequence share on
        packed rows (`dllm_train.packed_scoring.shares_clean_context`): a pass of rows [a, b)
        runs sum(row_cost[a:b]) - sum(shared_tokens[a + 1:b]) tokens. 0 elsewhere.
        """
        attn = attention_mask.bool()
        none = torch.zeros(attn.shape[0], dtype=torch.long, device=attn.device)
        if self.attention is None or self.block_length is None or not self.shared_context or clean_ids is None:
            return none
        return torch.where(shares_clean_context(attn, clean_ids), attn.sum(-1), none)

    def _bd3lm(self, noisy: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, clean: torch.Tensor,
               targets: torch.Tensor, temperature: float) -> torch.Tensor:
        """BD3LM likelihood with the model's own block-causal attention.

        For each block b holding a noised token, one row [x_0 of blocks < b ; x_t of block b]
        (later positions masked out as keys): under block-causal attention on the global grid
        the noisy block then sees exactly itself and the clean earlier blocks, i.e. the BD3LM
        visibility (`dllm_objectives.bd3lm_visible`), row by row.
        """
        assert self.block_length is not None
        bid = torch.where(attn, torch.div(pos, self.block_length, rounding_mode="floor"), -1)
        changed = (noisy != clean) & attn
        out = torch.zeros(targets.shape, dtype=self.value_dtype, device=noisy.device)
        blocks = torch.unique(bid[changed]).tolist()
        if not blocks:  # still one forward (an idle one), so every call is one pass on every rank
            return out + self.idle_pass()
        rows, row_attn = [], []
        for b in blocks:
            rows.append(torch.where(bid < b, clean, noisy))
            row_attn.append(attn & (bid <= b))
        m = noisy.shape[0]
        ids_all = torch.cat(rows)
        attn_all = torch.cat(row_attn)
        pos_all = pos.repeat(len(blocks), 1)
        tgt_all = targets.repeat(len(blocks), *([1] * (targets.dim() - 1)))
        logp = self._token_logp(ids_all, attn_all, pos_all, tgt_all, temperature)
        noised_in_row = [(changed & (bid == b)).any(-1, keepdim=True) for b in blocks]
        for i, b in enumerate(blocks):
            sel = (bid == b) & noised_in_row[i]  # a block of a row without a noised token scores 0
            if self.noised_only:
                sel = sel & changed
            if targets.dim() == 3:
                sel = sel[..., None].expand_as(out)
            out = torch.where(sel, logp[i * m:(i + 1) * m], out)
        return out


def plan_token_logp(scorer: ValuesScorer, input_ids: torch.Tensor, attention_mask: torch.Tensor, plan: MaskPlan,
                    *, temperature: float = 1.0, sample: int | None = None) -> torch.Tensor:
    """Log-prob of each clean token given each noised copy of a plan.

    Args:
        scorer: the model's scorer (or a stand-in, inside a values function).
        input_ids: [B, S] clean tokens.
        attention_mask: [B, S] bool, real tokens.
        plan: mask plan with mask [B, N, S].
        temperature: learner temperature.
        sample: score only copy `sample` (returns [B, 1, S]).

    Returns:
        float32 [B, N, S] (or [B, 1, S]).
    """
    noisy = apply_mask(input_ids, plan, scorer.mask_id)
    if sample is not None:
        noisy = noisy[:, sample:sample + 1]
    b, n, s = noisy.shape
    attn = attention_mask.bool().repeat_interleave(n, dim=0)
    clean = input_ids.repeat_interleave(n, dim=0)
    lp = scorer(noisy.reshape(b * n, s), attn, clean, temperature=temperature)
    return lp.reshape(b, n, s)


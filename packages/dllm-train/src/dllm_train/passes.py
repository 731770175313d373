"""Token-budget micro-batches for every likelihood pass, with exact gradients.

An algorithm computes its values (token log-probs, ELBOs, replayed steps, ...) from one or more
`Scorer` calls, each over a set of rows (Monte-Carlo copies, BD3LM rows, replay states, tree
segments...). Here every such call is split into passes of at most `max_tokens` tokens
(`Scorer.row_cost`, less the clean halves Monte-Carlo copies share: `Scorer.shared_tokens`), in
the spirit of verl's dynamic batch size, and the gradient of the loss is accumulated pass by
pass so that it equals the single-batch gradient:

- a *row-local* loss (its gradient with respect to a scored row depends on that row alone: token
  PPO, per-copy ELBO surrogates, step replays, weighted cross-entropy) is evaluated once per pass,
  with that pass's rows live and the other rows held by detached placeholders, and backpropagated:
  one forward and one backward per row;
- any other loss (a nonlinearity over several rows: a mean ELBO inside a clipped ratio, a DPO
  margin) first gets every row's value without grad (the old pass, when the weights have not
  moved since), then g = dL/d(scorer outputs) at those values, then one forward per pass
  backpropagating g: the exact gradient for deterministic forwards.

The values function is called several times (a shape trace, the passes, the final metrics) and
must make the same scorer calls each time; it is pure given its inputs. It runs against stand-in
scorers (a tracer that records calls, a replay that answers them), so it may use only what
`ValuesScorer` declares: the call and the special token ids, block length and lockstep group.
Ranks whose forwards are collectives (FSDP2) agree on the number of passes first and pad with
`Scorer.idle_pass`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from dllm_train.lockstep import group_max


class ValuesScorer(Protocol):
    """What a values function may use of its scorer: a `dllm_train.Scorer` or a stand-in of this module.

    Attributes:
        mask_id, eos_id, pad_id: the family's special token ids.
        block_length: block size of block-diffusion families (None: bidirectional masked LM).
        lockstep_group: the process group whose ranks run the same number of forwards (None: none).
    """

    @property
    def mask_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def block_length(self) -> int | None: ...

    @property
    def lockstep_group(self) -> dist.ProcessGroup | None: ...

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        """Log-probs of `targets` given the noisy input, [M, S] (or [M, S, C]); see `Scorer.__call__`."""
        ...


class PassScorer(ValuesScorer, Protocol):
    """What the passes use of a scorer: a `dllm_train.Scorer` (`likelihood.py`, which imports this
    module), or another with the same costs and idle pass (a `SequenceParallelScorer`).

    Attributes:
        value_dtype: dtype of the values a call returns.
    """

    @property
    def value_dtype(self) -> torch.dtype: ...

    def row_cost(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                 clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[M] tokens one forward runs for each row (`dllm_train.Scorer.row_cost`)."""
        ...

    def shared_tokens(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                      clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[M] tokens of row i's cost that row i - 1 already runs (`dllm_train.Scorer.shared_tokens`)."""
        ...

    def idle_pass(self) -> torch.Tensor:
        """One tiny forward kept in the graph, run in place of a pass a rank does not need."""
        ...


Metrics = dict[str, torch.Tensor]
ValuesFn = Callable[[ValuesScorer], torch.Tensor]
"""scorer -> values, pure given its inputs (see the module doc)."""
LossFn = Callable[[torch.Tensor], tuple[torch.Tensor, Metrics]]
"""values -> (scalar loss, metrics)."""


@dataclass(frozen=True)
class ScoreCall:
    """The inputs of one scorer call (see `Scorer.__call__`)."""

    noisy: torch.Tensor
    attention: torch.Tensor
    targets: torch.Tensor
    clean: torch.Tensor | None
    temperature: float

    def rows(self, index: torch.Tensor) -> ScoreCall:
        return ScoreCall(self.noisy[index], self.attention[index], self.targets[index],
                         None if self.clean is None else self.clean[index], self.temperature)

    def run(self, scorer: PassScorer) -> torch.Tensor:
        return scorer(self.noisy, self.attention, self.targets, clean_ids=self.clean, temperature=self.temperature)


@dataclass(frozen=True)
class Pass:
    """One forward: rows `rows` of call `call`."""

    call: int
    rows: torch.Tensor


class _Proxy:
    """A stand-in scorer: a `ValuesScorer` (mypy checks it where a values function receives it)
    answering its calls with `_answer`, with the special ids, block length and group of `scorer`."""

    def __init__(self, scorer: PassScorer) -> None:
        self.scorer = scorer
        self.mask_id, self.eos_id, self.pad_id = scorer.mask_id, scorer.eos_id, scorer.pad_id
        self.block_length = scorer.block_length
        self.lockstep_group = scorer.lockstep_group
        self.index = 0

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        call = ScoreCall(noisy_ids, attention_mask.bool(), targets, clean_ids, temperature)
        out = self._answer(self.index, call)
        self.index += 1
        return out

    def _answer(self, index: int, call: ScoreCall) -> torch.Tensor:
        raise NotImplementedError


class _Tracer(_Proxy):
    """Records the calls and answers zeros of the right shape (no model runs)."""

    def __init__(self, scorer: PassScorer) -> None:
        super().__init__(scorer)
        self.calls: list[ScoreCall] = []

    def _answer(self, index: int, call: ScoreCall) -> torch.Tensor:
        self.calls.append(call)
        return torch.zeros(call.targets.shape, dtype=self.scorer.value_dtype, device=call.noisy.device)


class _Replay(_Proxy):
    """Answers call i with outputs[i] (the calls must be those of the trace)."""

    def __init__(self, scorer: PassScorer, outputs: list[torch.Tensor]) -> None:
        super().__init__(scorer)
        self.outputs = outputs

    def _answer(self, index: int, call: ScoreCall) -> torch.Tensor:
        assert index < len(self.outputs) and self.outputs[index].shape == call.targets.shape, (
            "a values function made different scorer calls on two runs; it must be pure given its inputs")
        return self.outputs[index]


def token_budget(max_tokens_per_pass: int) -> int:
    """`max_tokens_per_pass` checked: a forward's token budget, 0 for none (one forward per call)."""
    if max_tokens_per_pass < 0:
        raise ValueError(f"max_tokens_per_pass must be >= 0 (0: no limit), got {max_tokens_per_pass}")
    return max_tokens_per_pass


def trace(values: ValuesFn, scorer: PassScorer) -> list[ScoreCall]:
    """The scorer calls `values` makes (no forward runs)."""
    tracer = _Tracer(scorer)
    with torch.no_grad():
        values(tracer)
    return tracer.calls


def split(calls: list[ScoreCall], scorer: PassScorer, max_tokens: int) -> list[Pass]:
    """Consecutive rows of each call in passes of at most `max_tokens` tokens (0: one pass per call).

    A pass of rows [a, b) costs what its forward runs: sum(row_cost[a:b]) less the clean halves
    that rows a + 1 .. b - 1 share with their predecessors (`Scorer.shared_tokens`), so a group of
    k Monte-Carlo copies of one block-family sequence costs L tokens (its clean half) plus each
    copy's noised blocks, and a group split over several passes pays one clean half in each. A group that cannot fit whole into the
    space left in the current pass starts a new pass unless the rows that fit now cost no extra
    clean half (see `_defer`). A row costing more than the budget alone gets a pass of its own.
    """
    passes: list[Pass] = []
    for i, call in enumerate(calls):
        m = call.noisy.shape[0]
        if m == 0:
            continue
        if max_tokens <= 0:
            passes.append(Pass(i, torch.arange(m, device=call.noisy.device)))
            continue
        clean = call.clean if call.clean is not None else (call.targets if call.targets.dim() == 2 else None)
        cost = scorer.row_cost(call.noisy, call.attention, clean).tolist()
        shared = scorer.shared_tokens(call.noisy, call.attention, clean).tolist()
        start, used = 0, 0
        for r, c in enumerate(cost):
            if r > start and (used + c - shared[r] > max_tokens
                              or (shared[r] == 0 and _defer(cost, shared, r, used, max_tokens))):
                passes.append(Pass(i, torch.arange(start, r, device=call.noisy.device)))
                start, used = r, 0
            used += c - (shared[r] if r > start else 0)
        passes.append(Pass(i, torch.arange(start, m, device=call.noisy.device)))
    return passes


def _defer(cost: list[int], shared: list[int], r: int, used: int, max_tokens: int) -> bool:
    """Whether the group of rows starting at row r (r and the rows that share its clean half) is
    better started in a fresh pass than in the current one, which has `used` tokens.

    Both choices are played out row by row as `split` fills passes (a row that does not fit
    starts a new pass and pays the group's clean half again); the group is deferred when starting
    now costs more clean halves than starting fresh. With g copies of equal cost, n_fresh of them
    per fresh pass and n_now fitting now, that is 1 + ceil((g - n_now) / n_fresh) against
    ceil(g / n_fresh); the copies of a block family's group cost unequally (each carries only its
    noised blocks), hence the play-out.
    """
    end = r + 1
    while end < len(cost) and shared[end] > 0:
        end += 1
    if end - r == 1:
        return False
    return _clean_halves(cost, shared, r, end, used, max_tokens) > _clean_halves(cost, shared, r, end, 0, max_tokens)


def _clean_halves(cost: list[int], shared: list[int], r: int, end: int, used: int, max_tokens: int) -> int:
    """Clean halves that rows r .. end - 1 (one group) pay when filled into passes from a pass with
    `used` tokens, as `split` fills them."""
    halves = 0
    for j in range(r, end):
        extra = cost[j] - (shared[j] if j > r else 0)
        if j > r and used + extra <= max_tokens:
            used += extra
            continue
        halves += 1  # the group's first row, or a row that starts a new pass: its clean half again
        used = cost[j] if (j > r or used + cost[j] > max_tokens) else used + cost[j]
    return halves


def _lockstep(scorer: PassScorer, passes: list[Pass]) -> int:
    """Passes of padding this rank runs so that every rank of the scorer's group runs as many."""
    return group_max(len(passes), scorer.lockstep_group) - len(passes)


def forward_outputs(calls: list[ScoreCall], scorer: PassScorer, max_tokens: int) -> list[torch.Tensor]:
    """Every call's scorer output, without grad, in passes of at most `max_tokens` tokens."""
    outs = [torch.zeros(c.targets.shape, dtype=scorer.value_dtype, device=c.noisy.device) for c in calls]
    passes = split(calls, scorer, max_tokens)
    pad = _lockstep(scorer, passes)
    with torch.no_grad():
        for p in passes:
            outs[p.call][p.rows] = calls[p.call].rows(p.rows).run(scorer).to(outs[p.call].dtype)
        for _ in range(pad):
            scorer.idle_pass()
    return outs


def evaluate(values: ValuesFn, scorer: PassScorer, max_tokens: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(values, raw scorer outputs) without grad, every call micro-batched."""
    outs = forward_outputs(trace(values, scorer), scorer, max_tokens)
    with torch.no_grad():
        return values(_Replay(scorer, outs)), outs


@dataclass(frozen=True)
class Update:
    """What `accumulate` computed: the loss and metrics at the full batch (detached), the values
    (detached) and the number of forwards it ran."""

    loss: torch.Tensor
    metrics: Metrics
    values: torch.Tensor
    forwards: int


def accumulate(values: ValuesFn, loss: LossFn, scorer: PassScorer, *, max_tokens: int, row_local: bool,
               outputs: list[torch.Tensor] | None = None) -> Update:
    """Backpropagate `loss(values(scorer))` pass by pass; the gradients equal the single-batch ones.

    Args:
        values: scorer -> values (see module doc: pure, same calls every time).
        loss: values -> (loss, metrics).
        scorer: runs the model.
        max_tokens: token budget of one forward (0: one forward per scorer call).
        row_local: the loss's gradient with respect to each scored row depends on that row only
            (then no value pass is needed; see module doc).
        outputs: every call's scorer output at the current weights, when already computed (e.g.
            by the old pass on-policy); a non-row-local loss then runs no value pass.

    Returns:
        `Update`; the gradients are accumulated into the parameters (the caller steps).
    """
    calls = trace(values, scorer)
    passes = split(calls, scorer, max_tokens)
    pad = _lockstep(scorer, passes)
    forwards = len(passes) + pad
    if row_local:
        held = [torch.zeros(c.targets.shape, dtype=scorer.value_dtype, device=c.noisy.device) for c in calls]
        for p in passes:
            out = calls[p.call].rows(p.rows).run(scorer)
            mixed = list(held)
            mixed[p.call] = held[p.call].index_put((p.rows,), out.to(held[p.call].dtype))
            value, _ = loss(values(_Replay(scorer, mixed)))
            torch.autograd.backward(value)
            held[p.call][p.rows] = out.detach().to(held[p.call].dtype)
        outputs = held
    else:
        if outputs is None:
            outputs = forward_outputs(calls, scorer, max_tokens)
            forwards *= 2
        leaves = [o.detach().requires_grad_(True) for o in outputs]
        value, _ = loss(values(_Replay(scorer, leaves)))
        grads = torch.autograd.grad(value, leaves, allow_unused=True)
        for p in passes:
            g = grads[p.call]
            if g is None:  # the loss does not read this call (e.g. a zero-weight term)
                g = torch.zeros_like(leaves[p.call])
            out = calls[p.call].rows(p.rows).run(scorer)
            torch.autograd.backward((out * g[p.rows]).sum())
    for _ in range(pad):
        torch.autograd.backward(scorer.idle_pass())
    with torch.no_grad():
        full = values(_Replay(scorer, outputs))
        total, metrics = loss(full)
    return Update(loss=total.detach(), metrics={k: v.detach() for k, v in metrics.items()}, values=full.detach(),
                  forwards=forwards)


__all__ = ["LossFn", "Pass", "ScoreCall", "Update", "ValuesFn", "ValuesScorer", "accumulate", "evaluate", "forward_outputs",
           "split", "trace"]

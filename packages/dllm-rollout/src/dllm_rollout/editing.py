"""Token editing of block diffusion: LLaDA2.1's joint-threshold decoding (docs/generation.md#llada2).

LLaDA2.1 (Bie et al., "LLaDA2.1: Speeding Up Text Diffusion via Token Editing", arXiv 2602.08676;
the `generate` of its HF checkpoint and SGLang's `JointThreshold`) decodes a block with two rules per
step, both read from one proposal x0 and its confidence:

- mask-to-token: masked positions are committed by the threshold rule (see `select`);
- token-to-token: an already-filled, non-prompt position of the block is overwritten when its new
  proposal differs from the current token and has confidence > `editing_threshold`.

A block ends when a step starts without masks and makes no edit, or when `max_post_steps` steps
have run after its last mask was filled. These functions hold the per-row rules; the step loop
lives in `block.decode_blocks`.

Records: an edited position keeps the step of its last write in `unmask_step` and the log-prob of
the token finally kept, on the canvas of that step, in `step_logp`. A step replay rebuilt from
`unmask_step` therefore does not see the tokens that were overwritten, so a sample with edits
cannot be replayed step by step; `RolloutBatch.extras[EDITS]` [B] counts each row's edits (rows
with 0 replay exactly: steps after a block is filled commit nothing and only leave gaps in the
step numbers).
"""

from __future__ import annotations

import torch

EDITS = "num_edits"


def editable(block: torch.Tensor, mask_id: int, lo: int, span: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Positions [B, n] a step may edit: filled (not the mask), inside the row's own span.

    Args:
        block: [B, n] the block's tokens at the start of the step.
        lo: the block's first column, counted from the decode region start.
        span: ([B], [B]) region columns [first, end) of each row's response and the rest of its
            terminal block. The prompt tail before it (sharing the first decode block) is never
            edited; blocks after it (decoded only because a longer row needs them) are not
            edited either, so edits counted are edits of the row's own sample.
    """
    col = lo + torch.arange(block.shape[1], device=block.device)[None]
    return (block != mask_id) & (col >= span[0][:, None]) & (col < span[1][:, None])


def edit_mask(x0: torch.Tensor, conf: torch.Tensor, block: torch.Tensor, candidates: torch.Tensor,
              editing_threshold: float) -> torch.Tensor:
    """Token-to-token edits [B, n]: candidates whose proposal changes the token with confidence > threshold.

    Args:
        x0: [B, n] this step's proposals; conf: [B, n] their confidences.
        block: [B, n] the block's tokens at the start of the step.
        candidates: [B, n] bool, editable positions of rows taking the step (`editable`).
    """
    return candidates & (x0 != block) & (conf.float() > editing_threshold)


def step_edits(x0: torch.Tensor, conf: torch.Tensor, block: torch.Tensor, active: torch.Tensor, *, mask_id: int,
               lo: int, span: tuple[torch.Tensor, torch.Tensor], editing_threshold: float | None) -> torch.Tensor:
    """A decoding step's edits [B, n] in the block of region columns [lo, lo + n) (none without editing).

    Args:
        x0, conf, block: [B, n] as in `edit_mask`; active: [B] rows taking the step;
        span: as in `editable`.
    """
    if editing_threshold is None:
        return torch.zeros_like(block, dtype=torch.bool)
    candidates = editable(block, mask_id, lo, span) & active[:, None]
    return edit_mask(x0, conf, block, candidates, editing_threshold)


def rows_to_step(open_rows: torch.Tensor, has_mask: torch.Tensor, post_steps: torch.Tensor,
                 max_post_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [B] that take the next step of the block, and the updated post-fill step counts [B].

    A row still open in the block steps while it has masks; once filled, each further step counts
    as a post-fill step, and a row whose count would exceed `max_post_steps` stops. With
    `max_post_steps=0` a row stops as soon as its block is filled (decoding without editing).

    Args:
        open_rows: [B] bool, rows that have not finished the block; has_mask: [B] bool, rows with
            masks left in the block; post_steps: [B] long, post-fill steps taken so far.
    """
    post_steps = post_steps + (open_rows & ~has_mask).long()
    return open_rows & (has_mask | (post_steps <= max_post_steps)), post_steps


def still_open(stepped: torch.Tensor, had_mask: torch.Tensor, edits: torch.Tensor) -> torch.Tensor:
    """Rows [B] that keep decoding the block: they stepped and either had masks or edited a token.

    Args:
        stepped: [B] rows that took the step; had_mask: [B] rows with masks at its start;
        edits: [B, n] the step's edits.
    """
    return stepped & (had_mask | edits.any(-1))

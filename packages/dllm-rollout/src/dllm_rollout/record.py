"""Per-row trajectory records kept while decoding (engine-agnostic, see RolloutBatch)."""

from __future__ import annotations

import torch


class Recorder:
    """Collects what each row committed at each of its own steps.

    Records live on a "region" of width W (the response canvas, possibly wider than the response
    for block diffusion) and are cut to the response by `take`.

    Steps are counted per row: a row's step counter advances only on steps where it still had
    masks in the current block, so a sample's records do not depend on the batch it ran in.
    `forwards` counts the steps each row took in this decode (`RolloutBatch.forwards`; `row_step`
    may start later, at a resumed step).
    """

    def __init__(self, batch: int, width: int, device: torch.device, *, steps: bool, ref: bool) -> None:
        self.row_step = torch.zeros(batch, dtype=torch.long, device=device)
        self.forwards = torch.zeros(batch, dtype=torch.long, device=device)
        self.unmask_step = torch.full((batch, width), -1, dtype=torch.long, device=device)
        self.step_logp = torch.zeros((batch, width), dtype=torch.float32, device=device)
        self.ref_step_logp = torch.zeros((batch, width), dtype=torch.float32, device=device) if ref else None
        self.keep_steps = steps
        self._canvas: list[torch.Tensor] = []
        self._x0: list[torch.Tensor] = []
        self._conf: list[torch.Tensor] = []
        self._when: list[torch.Tensor] = []

    def record(
        self,
        active: torch.Tensor,
        lo: int,
        commit: torch.Tensor,
        x0: torch.Tensor,
        logp: torch.Tensor,
        conf: torch.Tensor,
        region_before: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        prediction: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """One decoding step over region columns [lo, lo + n).

        Args:
            active: [B] rows that took this step; commit/x0/logp/conf/ref_logp: [B, n];
            region_before: [B, W] the region canvas before the commit.
            prediction: the step's record over the whole region, ([B, W] tokens, [B, W] confidences)
                (`dllm_rollout.prediction.full_prediction`); None: the block's proposals `x0` and
                confidences `conf` on the region canvas (NaN confidence outside the block).
        """
        hi = lo + commit.shape[1]
        step = self.row_step[:, None].expand_as(commit)
        self.unmask_step[:, lo:hi] = torch.where(commit, step, self.unmask_step[:, lo:hi])
        self.step_logp[:, lo:hi] = torch.where(commit, logp.float(), self.step_logp[:, lo:hi])
        if self.ref_step_logp is not None and ref_logp is not None:
            self.ref_step_logp[:, lo:hi] = torch.where(commit, ref_logp.float(), self.ref_step_logp[:, lo:hi])
        if self.keep_steps:
            if prediction is None:
                prediction = _block_prediction(region_before, lo, x0, conf)
            self._canvas.append(region_before.clone())
            self._x0.append(prediction[0])
            self._conf.append(prediction[1].float())
            self._when.append(torch.where(active, self.row_step, -1))
        self.row_step += active.long()
        self.forwards += active.long()

    def rows(self, keep: torch.Tensor) -> Recorder:
        """A recorder of rows `keep` [n] (long) only, with their records so far (copies).

        For decoding that retires finished rows from the batch; per-step records (`steps=True`)
        are kept per batch, so they cannot be split.
        """
        if self.keep_steps:
            raise ValueError("Recorder.rows: per-step records (record_steps) cannot be split by rows")
        sub = Recorder.__new__(Recorder)
        sub.row_step, sub.unmask_step = self.row_step[keep], self.unmask_step[keep]
        sub.forwards = self.forwards[keep]
        sub.step_logp = self.step_logp[keep]
        sub.ref_step_logp = None if self.ref_step_logp is None else self.ref_step_logp[keep]
        sub.keep_steps, sub._canvas, sub._x0, sub._conf, sub._when = False, [], [], [], []
        return sub

    def put(self, rows: torch.Tensor, sub: Recorder) -> None:
        """Write the records of `sub` (made by `rows`, maybe narrowed further) back at rows `rows` [n]."""
        self.row_step[rows] = sub.row_step
        self.forwards[rows] = sub.forwards
        self.unmask_step[rows] = sub.unmask_step
        self.step_logp[rows] = sub.step_logp
        if self.ref_step_logp is not None and sub.ref_step_logp is not None:
            self.ref_step_logp[rows] = sub.ref_step_logp

    def take(self, offsets: torch.Tensor, length: int, mask_id: int) -> dict[str, torch.Tensor]:
        """Records cut to response columns [offset_b, offset_b + length) of each row.

        Returns:
            unmask_step, step_logp, ref_step_logp [B, R]; with steps also step_canvas, step_x0
            [B, S, R] long (mask id after a row's last step) and step_confidence [B, S, R] float32
            (without a full `prediction`: NaN outside the block that was being decoded).
        """
        idx = offsets[:, None] + torch.arange(length, device=offsets.device)[None]
        out = {
            "unmask_step": self.unmask_step.gather(1, idx),
            "step_logp": self.step_logp.gather(1, idx),
        }
        if self.ref_step_logp is not None:
            out["ref_step_logp"] = self.ref_step_logp.gather(1, idx)
        if self.keep_steps and self._when:
            s_max = int(self.row_step.max().item())
            b = offsets.shape[0]
            canvas = torch.full((b, s_max, length), mask_id, dtype=torch.long, device=offsets.device)
            x0 = canvas.clone()
            conf = torch.full((b, s_max, length), float("nan"), device=offsets.device)
            for when, c, x, f in zip(self._when, self._canvas, self._x0, self._conf):
                rows = torch.nonzero(when >= 0).flatten()
                canvas[rows, when[rows]] = c.gather(1, idx)[rows]
                x0[rows, when[rows]] = x.gather(1, idx)[rows]
                conf[rows, when[rows]] = f.gather(1, idx)[rows]
            out.update(step_canvas=canvas, step_x0=x0, step_confidence=conf)
        return out


def _block_prediction(region: torch.Tensor, lo: int, x0: torch.Tensor,
                      conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's proposals x0 [B, n] written over `region` [B, W] at [lo, lo + n), confidences NaN elsewhere."""
    x0_region = region.clone()
    x0_region[:, lo:lo + x0.shape[1]] = x0
    conf_region = torch.full(region.shape, float("nan"), device=conf.device)
    conf_region[:, lo:lo + x0.shape[1]] = conf.float()
    return x0_region, conf_region

"""Stopping a run cleanly: preemption signals, and divergence.

Clusters stop jobs with SIGTERM (Slurm, Kubernetes) some time before SIGKILL, and users with
Ctrl-C (SIGINT). During a phase `Run` turns the first of them into a request: the current step
finishes, a checkpoint is written and `Interrupted` is raised; a second signal raises it at once,
without a new checkpoint. A repeat of the first signal within `DUPLICATE_WINDOW_S` seconds is the
same request delivered twice, not a second one: `uv run` forwards to its child the SIGINT the
terminal already sent to the whole process group (~0.2 s later) and the SIGTERM a scheduler sent
to the group (at once), so without the window the documented entry point would lose the
checkpoint. A user who means "stop now" sends the signal again after the window. The exit status of a process stopped this way is `128 + signal number`
(130 for SIGINT, 143 for SIGTERM), as for a process killed by the signal, but only after the
checkpoint is on disk.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)

DUPLICATE_WINDOW_S = 1.0
"""A repeat of the first signal this soon after it is a duplicate delivery (`uv run` forwarding
what the process group already received), not a second request."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal.

    Attributes:
        signum: the signal's number.
        checkpoint: the checkpoint written on the way out (None: a second signal stopped it first).
        exit_code: 128 + signum, the documented exit status.
    """

    def __init__(self, signum: int, checkpoint: Path | None) -> None:
        super().__init__(f"{signal.Signals(signum).name}: checkpoint {checkpoint}")
        self.signum = signum
        self.checkpoint = checkpoint
        self.exit_code = 128 + signum


class Diverged(ValueError):
    """Training stopped on non-finite values before they reached a checkpoint."""


class StopRequest:
    """The first SIGTERM/SIGINT received inside `catching()` (`signum`; None: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received_at = 0.0  # time.monotonic() of the first signal

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def is_duplicate(self, signum: int) -> bool:
        """Whether `signum` repeats the first signal within `DUPLICATE_WINDOW_S` (one request delivered twice)."""
        return signum == self.signum and time.monotonic() - self.received_at < DUPLICATE_WINDOW_S

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.is_duplicate(signum):
            logger.debug("%s repeated within %.1f s: one request", signal.Signals(signum).name, DUPLICATE_WINDOW_S)
            return
        if self.signum is not None:
            raise Interrupted(signum, None)
        self.signum, self.received_at = signum, time.monotonic()
        logger.warning("%s received: finishing this step, then writing a checkpoint (send it again, more than "
                       "%.0f s later, to stop at once, without one)", signal.Signals(signum).name, DUPLICATE_WINDOW_S)

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Within the block, SIGTERM and SIGINT set `signum` instead of stopping the process
        (main thread only; elsewhere signals keep their handlers). Afterwards the previous handlers
        are back; the requested signal's behind `_after`, which still drops the request's late duplicate."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[int, Any] = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if s != self.signum else self._after(handler))

    def _after(self, previous: Any) -> Any:
        """A handler that drops a duplicate of the request (`is_duplicate`) and otherwise acts as `previous`."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.is_duplicate(signum):
                return
            signal.signal(signum, previous)  # the window is over: the previous handler again, for good
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.raise_signal(signum)  # SIG_DFL: what the signal would have done

        return handle


__all__ = ["DUPLICATE_WINDOW_S", "Diverged", "Interrupted", "SIGNALS", "StopRequest"]

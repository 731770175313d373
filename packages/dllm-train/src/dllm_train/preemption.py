"""Stopping a run cleanly: preemption signals, and divergence.

Clusters stop jobs with SIGTERM (Slurm, Kubernetes) some time before SIGKILL, and users with
Ctrl-C (SIGINT). During a phase `Run` turns the first of them into a request: the current step
finishes, a checkpoint is written and `Interrupted` is raised; a second signal raises it at once,
without a new checkpoint. The exit status of a process stopped this way is `128 + signal number`
(130 for SIGINT, 143 for SIGTERM), as for a process killed by the signal, but only after the
checkpoint is on disk.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


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

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise Interrupted(signum, None)
        self.signum = signum
        logger.warning("%s received: finishing this step, then writing a checkpoint (send it again to stop "
                       "at once, without one)", signal.Signals(signum).name)

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Within the block, SIGTERM and SIGINT set `signum` instead of stopping the process
        (main thread only; elsewhere signals keep their handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[int, Any] = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


__all__ = ["Diverged", "Interrupted", "SIGNALS", "StopRequest"]

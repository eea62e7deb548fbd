"""Preemption: SLURM sends SIGUSR2 (or SIGTERM) before it takes a node back. The driver turns the signal
into a flag; stages poll it at safe points, commit their partial progress, and raise Preempted; the job
exits with PREEMPTED_EXIT so the scheduler requeues it, and the run resumes from the store."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PREEMPTED_EXIT = 75
"""Exit status after a preemption (EX_TEMPFAIL): progress is committed, the job should be requeued."""


class Preempted(RuntimeError):
    """A stage stopped at a safe point after a preemption signal; its partial progress is committed.
    `progressed`: whether this attempt committed anything before it stopped."""

    def __init__(self, message: str, *, progressed: bool = True) -> None:
        super().__init__(message)
        self.progressed = progressed


class StopFlag:
    """Turns SIGUSR2/SIGTERM (preemption) into a flag that stages poll at safe points."""

    def __init__(self) -> None:
        self.raised = False
        self.raised_at: float | None = None
        """When the first stop signal came (time.monotonic()): a job's signal grace counts from then."""

    def __call__(self) -> bool:
        return self.raised

    def signalled(self, signum: int | None = None, frame: object = None) -> None:
        """The signal handler: raise the flag (noting when, the first time)."""
        if not self.raised:
            self.raised_at = time.monotonic()
        self.raised = True

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Handle the signals while inside. Only the main thread may install handlers: elsewhere (a
        Prefect task thread, say) the flag stays down and the caller's own preemption handling applies."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        previous = {s: signal.signal(s, self.signalled) for s in (signal.SIGUSR2, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

"""Fault points for the preemption drills: the tests kill or pause a run at a named point and resume it.

A point is `<update>:<stage>:<when>` (when: before-commit | after-commit; for a shard of generation also
claimed: a rank took the chunk and has not decoded it; for a mini-batch of the optimizer, done: it stepped
and nothing of it is committed), e.g. `1:optimize.minibatch-0000:done`, the safe point right after the
optimizer's first mini-batch, where a stop commits the trainer state as `optimize.part-0000`.
- `PROBEPO_CRASH_AT=<point>` makes the process SIGKILL itself there, exactly as a node failure would: no
  handler, no cleanup, no flush. `<point>@<node>` makes only the ranks on that node (by SLURM's name for
  it) do so, as when one node of a multi-node job dies.
- `PROBEPO_PAUSE_AT=<point>[,<point>...]` makes it stop there and wait for a preemption signal, so that a
  drill sends SIGUSR2 or SIGTERM (or preempts the SLURM job) at a known place every time. On arriving it
  writes `<pid> <point>` to the file `PROBEPO_PAUSE_MARK` (if set), so the drill knows when and whom to
  act on. It goes on without a signal once the file `PROBEPO_PAUSE_RELEASE` exists (a drill that kills
  the driver, not the stage), and waits at most `PAUSE_TIMEOUT_S`, then fails loudly rather than hang.
- `PROBEPO_STOP_AT=<point>` makes the process send itself SIGUSR2 there, as SLURM does to every task of a
  job it is about to take back: the stop arrives at a known point with no drill waiting on a mark (and
  with `PROBEPO_CRASH_AT` at a later point, a grace window that runs out there).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

CRASH_ENV = "PROBEPO_CRASH_AT"
PAUSE_ENV = "PROBEPO_PAUSE_AT"
STOP_ENV = "PROBEPO_STOP_AT"
PAUSE_MARK_ENV = "PROBEPO_PAUSE_MARK"
PAUSE_RELEASE_ENV = "PROBEPO_PAUSE_RELEASE"
PAUSE_TIMEOUT_S = 120.0


class PauseTimeout(RuntimeError):
    """A paused stage saw no preemption signal in time (the drill did not send one)."""


def fault_point(update: int, stage: str, when: str, should_stop: Callable[[], bool]) -> None:
    """Crash, stop or pause here if PROBEPO_CRASH_AT / PROBEPO_STOP_AT / PROBEPO_PAUSE_AT name this point
    (a no-op otherwise).

    A pause returns once `should_stop()` is true (the stop flag raised by the signal), so the stage then
    reaches its next safe-point check exactly as after a real preemption.
    """
    point = f"{update}:{stage}:{when}"
    crash_point, _, crash_node = os.environ.get(CRASH_ENV, "").partition("@")
    if crash_point == point and (not crash_node or crash_node == _node()):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_ENV) == point:
        signal.raise_signal(signal.SIGUSR2)  # its handler has run when this returns (main thread)
    if point not in os.environ.get(PAUSE_ENV, "").split(","):
        return
    mark, release = os.environ.get(PAUSE_MARK_ENV), os.environ.get(PAUSE_RELEASE_ENV)
    if mark:
        Path(mark).write_text(f"{os.getpid()} {point}\n")
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not should_stop() and not (release and Path(release).exists()):
        if time.monotonic() > deadline:
            raise PauseTimeout(f"paused at {point} for {PAUSE_TIMEOUT_S:.0f} s and no preemption signal came")
        time.sleep(0.05)


def _node() -> str:
    from probepo.run.distributed import node_name  # torch: only where a crash names a node

    return node_name()

"""Crash points for the preemption drills: the tests kill a run at a named point and resume it.

`PROBEPO_CRASH_AT="<update>:<stage>:<when>"` (when: before-commit | after-commit) makes the process
SIGKILL itself there, exactly as a node failure would: no handler, no cleanup, no flush.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "PROBEPO_CRASH_AT"


def crash_point(update: int, stage: str, when: str) -> None:
    """SIGKILL this process if PROBEPO_CRASH_AT names this point (a no-op otherwise)."""
    if os.environ.get(CRASH_ENV) == f"{update}:{stage}:{when}":
        os.kill(os.getpid(), signal.SIGKILL)

"""The base of the execution layer's errors, in a module of its own so that the CLI can catch it without
loading torch (probepo.run.execution imports the stages)."""

from __future__ import annotations


class ExecutionError(RuntimeError):
    """What the execution layer raises when a stage cannot be run; the CLI and the flows catch this one
    base. `user_error`: the request or the site is at fault (a refused submission, SLURM unreachable, an
    unknown executor), so the message alone says what to do; otherwise the message carries the job's own
    error (the end of its stderr)."""

    user_error = False

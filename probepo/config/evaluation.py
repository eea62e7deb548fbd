"""Which checkpoints an evaluation after the fact takes (the nightly evaluation's form, the evaluate flow):
runs by name or pattern, and of each run's committed checkpoints the latest, every N-th, or those since a
time. What was evaluated already is never done again, whatever the selection."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import Field, field_validator

from probepo.config.base import Strict


class CheckpointSelection(Strict):
    """Runs and checkpoints to evaluate. The filters combine: a checkpoint is taken when its run matches
    `runs`, its update is in `updates` (if given) and a multiple of `every`, and it was committed at or
    after `since`; then `latest` keeps each run's newest of those."""

    runs: tuple[str, ...] = ()
    """Run ids or glob patterns (`grpo-*`, `*-7b-?`); empty: every run in the store."""

    latest: bool = False
    """Only each run's newest selected checkpoint: what a night needs to follow runs in progress."""

    every: int = Field(1, ge=1)
    """Only checkpoints whose update is a multiple of this (1: every committed checkpoint)."""

    since: datetime | None = None
    """Only checkpoints committed at or after this time (ISO 8601, e.g. `2026-12-01` or
    `2026-12-01T18:00:00+01:00`; UTC when no zone is given); None: whenever."""

    updates: tuple[int, ...] = ()
    """Only the checkpoints of these updates; empty: any update."""

    @field_validator("since")
    @classmethod
    def _in_utc(cls, since: datetime | None) -> datetime | None:
        if since is not None and since.tzinfo is None:
            return since.replace(tzinfo=UTC)
        return since

    @field_validator("runs")
    @classmethod
    def _no_empty_names(cls, runs: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name.strip() for name in runs):
            raise ValueError("an empty run name or pattern: give run ids or globs such as `grpo-*`")
        return runs

    def takes_run(self, run_id: str) -> bool:
        """Whether the run's id matches `runs` (every run when none are given)."""
        return not self.runs or any(fnmatch.fnmatchcase(run_id, pattern) for pattern in self.runs)

    def choose(self, committed: list[int], committed_at: Callable[[int], datetime]) -> list[int]:
        """Of one run's committed checkpoints (their updates), those selected, ascending; `committed_at`
        tells when an update's checkpoint was committed (asked only with `since`)."""
        chosen = sorted(
            update
            for update in committed
            if (not self.updates or update in self.updates)
            and update % self.every == 0
            and (self.since is None or committed_at(update) >= self.since)
        )
        return chosen[-1:] if self.latest else chosen

    def describe(self) -> str:
        """One line for logs and artifacts, e.g. `runs grpo-*, latest checkpoint, every 3rd update`."""
        parts = [f"runs {', '.join(self.runs)}" if self.runs else "every run"]
        parts.append("latest checkpoint" if self.latest else "checkpoints")
        if self.updates:
            parts.append(f"of updates {', '.join(map(str, self.updates))}")
        if self.every > 1:
            parts.append(f"every {ordinal(self.every)} update")
        if self.since is not None:
            parts.append(f"committed since {self.since.isoformat()}")
        return ", ".join(parts)


def ordinal(number: int) -> str:
    """`1st`, `2nd`, `3rd`, `4th`, `11th`, `12th`, `13th`, `21st`, `112th`."""
    suffix = "th" if number % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"

"""What the driver makes of stage jobs' ends beyond the job it waits for: the deaths of a stage's jobs counted
in a row (`Deaths`), and the records of the run's jobs that ended while no driver watched closed by the
next driver (`close_unwatched`). The loop that submits and waits is slurm/runner.py's."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from probepo.execution import StageRequest
from probepo.store import ArtifactStore, AttemptOutcome, JobOutcome

if TYPE_CHECKING:
    from slurm.runner import JobRunner

log = logging.getLogger(__name__)


@dataclass
class Deaths:
    """The deaths of one stage's jobs (ended without committing the stage, and without a stage error) in a
    row: a job that committed any of its work since the last death (a shard, a part, for the resident job
    any stage) starts the count over, so a weeks-long run is stopped by deaths in a row, never by deaths
    days apart."""

    count: int = 0
    since: str = ""
    """When the first death of the row was seen to end."""

    def died(self, ended_at: str, progressed: bool) -> None:
        """A job died, ending at `ended_at`, having committed some of its work (`progressed`) or not."""
        if progressed or not self.count:
            self.count, self.since = 1, ended_at
        else:
            self.count += 1

    def too_many(self, max_resubmits: int) -> str | None:
        """Why no job is submitted again once the row is longer than `max_resubmits` (None: it is not)."""
        if self.count <= max_resubmits:
            return None
        return (
            f"{self.count} deaths in a row since {self.since}, none after a commit of its work"
            f" (max_resubmits = {max_resubmits})"
        )


def close_unwatched(runner: JobRunner, store: ArtifactStore, request: StageRequest) -> None:
    """Close the records of `runner`'s jobs of the run that ended while no driver watched (a driver killed
    while they ran), judged as `JobRunner.run` judges an ending, so `probepo jobs` shows what they did. Jobs
    still pending or running stay open, and so does the last job of the stage at hand (its driver
    re-attaches to them, reporting a failure as a watched one would), and any job the backend knows no
    state of (said in the log): a later driver closes it once its state is known."""
    records = runner.open_jobs(store, request.run_id)
    if not records:
        return
    ids = {str(r["job_id"]): r.get("submitted_epoch", 0.0) for r in records}
    infos = runner.backend.states(list(ids), ids)
    for record in records:
        info = infos.get(str(record["job_id"]))
        if info is None:
            log.warning(
                "run %s: %s's job %s of update %s (%s) is open in the store, but %s reports no state of"
                " it: its record stays open",
                request.run_id,
                record["stage"],
                record["job_id"],
                record["update"],
                record.get("submitted_at", "submitted at an unknown time"),
                runner.backend.name,
            )
            continue
        if info.alive or (record["update"], record["stage"]) == (request.update, request.stage):
            continue  # alive: re-attached to; the stage at hand: `run` re-attaches and judges it itself
        at = replace(request, update=record["update"], stage=record["stage"])
        outcome, attempt = runner.judged(store, at, record)
        error = (
            {"error": AttemptOutcome.error_of(attempt)} if outcome == JobOutcome.FAILED and attempt else {}
        )
        runner.close(store, at, dict(record), info, outcome, unwatched="true", **error)

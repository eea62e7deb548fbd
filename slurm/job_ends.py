"""What the driver makes of stage jobs' ends beyond the job it waits for: the deaths of a stage's jobs counted
in a row (`Deaths`), a job that gave up on an unreachable store told apart (a death, named so), and the
records of the run's jobs that ended while no driver watched closed by the next driver (`close_unwatched`).
The loop that submits and waits is slurm/runner.py's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from probepo.run.execution import StageRequest
from probepo.store import ArtifactStore, AttemptOutcome, JobOutcome, StoreOutage
from probepo.store.outage import STORE_UNREACHABLE_EXIT
from slurm.accounting import JobInfo

if TYPE_CHECKING:
    from slurm.runner import JobRunner

log = logging.getLogger(__name__)

STORE_CAUSE = "it gave up on the unreachable store"
"""A job record's `cause` when the job died of a store outage longer than the profile's store_outage_s."""


def failed_on_store(attempt: Mapping[str, Any] | None) -> bool:
    """Whether an attempt record says its stage failed because the store stayed unreachable (written once
    the store answered again): not the stage's own error, so its job is submitted again."""
    return (
        attempt is not None
        and AttemptOutcome.of(attempt) == AttemptOutcome.FAILED
        and AttemptOutcome.error_of(attempt).startswith(f"{StoreOutage.__name__}:")
    )


def end_notes(outcome: JobOutcome, info: JobInfo, attempt: Mapping[str, Any] | None) -> dict[str, str]:
    """What a job record notes of an end beyond its outcome: a stage's own error, or a death's cause where
    the job gave up on the store (it exited STORE_UNREACHABLE_EXIT, or its attempt record says so; a job
    whose record the store never got and whose exit status SLURM lost to its other ranks is a plain
    death)."""
    if outcome == JobOutcome.FAILED and attempt is not None:
        return {"error": AttemptOutcome.error_of(attempt)}
    exited = info.exit_code.split(":")[0] == str(STORE_UNREACHABLE_EXIT)
    if outcome == JobOutcome.DIED and (exited or failed_on_store(attempt)):
        return {"cause": STORE_CAUSE}
    return {}


@dataclass
class Deaths:
    """The deaths of one stage's jobs (ended without committing the stage, and without a stage error) in a
    row: a job that committed any of its work since the last death (a shard, a part, for the resident job
    any stage) starts the count over, so a weeks-long run is stopped by deaths in a row, never by deaths
    days apart."""

    count: int = 0
    since: str = ""
    """When the first death of the row was seen to end."""
    of_the_store: int = 0
    """How many deaths of the row were jobs that gave up on an unreachable store."""

    def died(self, ended_at: str, progressed: bool, of_the_store: bool = False) -> None:
        """A job died, ending at `ended_at`, having committed some of its work (`progressed`) or not, of an
        unreachable store (`of_the_store`) or not."""
        if progressed or not self.count:
            self.count, self.since, self.of_the_store = 1, ended_at, 0
        else:
            self.count += 1
        self.of_the_store += of_the_store

    def too_many(self, max_resubmits: int) -> str | None:
        """Why no job is submitted again once the row is longer than `max_resubmits` (None: it is not)."""
        if self.count <= max_resubmits:
            return None
        store = (
            f"; {self.of_the_store} of them because the store stayed unreachable past store_outage_s: check"
            " the endpoint, then resume the run"
            if self.of_the_store
            else ""
        )
        return (
            f"{self.count} deaths in a row since {self.since}, none after a commit of its work"
            f" (max_resubmits = {max_resubmits}){store}"
        )


def settle(
    runner: JobRunner, store: ArtifactStore, request: StageRequest, job: dict[str, Any], info: JobInfo
) -> tuple[JobOutcome, bool]:
    """Judge an ended job and record its end (with its error or its death's cause); returns the outcome
    and, for a death, whether the stage's committed work grew since the job was submitted."""
    outcome, attempt = runner.judged(store, request, job)
    progressed = outcome == JobOutcome.DIED and (
        runner.progress(store, request) > job.get("progress_at_submit", 0)
    )
    runner.close(store, request, job, info, outcome, **end_notes(outcome, info, attempt))
    return outcome, progressed


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
        runner.close(
            store, at, dict(record), info, outcome, unwatched="true", **end_notes(outcome, info, attempt)
        )

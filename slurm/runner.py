"""The driver's side of a stage job: submit it (or re-attach to the one already in flight), record it in the
store before waiting, watch it, and decide what its end means.

- The job record (`jobs/<k>/<stage>/<submission>.json`: executor, job id, state, node) is written before
  the driver waits, and updated as the job moves; a driver that starts while a stage's job is pending or
  running (the id in its last record) waits for that job instead of submitting another.
- The job's own attempt records (written by `execute_stage` inside it, with its job id) say what the stage
  did: committed, preempted, failed (the stage's own error: never submitted again), or nothing at all
  (killed outright, the node failed, out of memory, past its time limit: submitted again, at most
  `max_resubmits` times in a row; a job that committed any of its work before dying starts the count over).
  A preempted SLURM job requeued itself and is still alive: the driver keeps waiting. Exactly-once comes
  from the store's markers, never from the scheduler.
- A driver that starts closes the records of the run's jobs that ended while no driver watched (judged
  from the store as above), so `probepo jobs` shows what they did.
- A job rides out an unreachable store up to the profile's `store_outage_s` (probepo/store/outage.py);
  one that gave up all the same died of the store: submitted again like any death, the store named as
  the cause. The driver only waits: a poll without the store says "store unreachable since T" and goes
  on, and what it must know or record is tried again every poll_max_s until the store answers.

Counting deaths in a row and closing unwatched records are slurm/job_ends.py's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from probepo.config import ExecutionProfile
from probepo.errors import ExecutionError
from probepo.run.execution import StageRequest, now
from probepo.run.preemption import Preempted
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, AttemptOutcome, JobOutcome, StoreOutage
from probepo.store.keys import new_attempt_id
from probepo.store.outage import RIDER, OutageBudget
from slurm.accounting import JobInfo
from slurm.backends import Backend, JobFunction, SubmitFailed, SubmitTransient
from slurm.job import run_driver_job, run_stage_job
from slurm.job_ends import STORE_CAUSE, Deaths, close_unwatched, failed_on_store, settle

SUBMIT_TRIES = 4
"""Submissions of one job before a run of transient refusals (SubmitTransient) becomes SubmitFailed."""
POLL_GROWTH = 1.25
"""How much the wait between two polls of a job grows after a poll that saw nothing change: each wait is
then about a quarter of the time the job has gone unchanged, so the end of a short stage is seen within
seconds, and a day-long job costs one sacct call per poll_max_s."""
STOP_CHECK_S = 1.0
"""A wait between polls is slept in slices at most this long, so that a driver told to stop (SIGTERM,
SIGUSR2) notices within one, however long the wait has grown."""
T = TypeVar("T")
log = logging.getLogger(__name__)


class StageFailed(ExecutionError):
    """A stage's job ended without committing and will not be submitted again: its own error, or it died
    more often than the profile allows. Names the job id, its state, exit code and the tail of its stderr."""


class DriverStopped(Preempted):
    """The driver was told to stop (SIGTERM, SIGUSR2) while a stage's job was in flight. The job goes on;
    `probepo resume` re-attaches to it."""


class Backoff:
    """The waits between the polls of one job: `start` seconds after a poll that saw a change (a new state,
    a commit), then `growth` times longer after each poll that saw none, up to `cap`."""

    def __init__(self, start: float, cap: float, growth: float = POLL_GROWTH) -> None:
        self.start, self.cap, self.growth = start, cap, growth
        self._next = start

    def after(self, changed: bool) -> float:
        """Seconds to wait before the next poll, after a poll that saw a change or not."""
        if changed:
            self._next = self.start
        wait = self._next
        self._next = min(wait * self.growth, self.cap)
        return wait


def sleep_unless_stopped(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Sleep `seconds`, in slices of at most STOP_CHECK_S, returning early once `should_stop()` says so."""
    deadline = time.monotonic() + seconds
    while not should_stop() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, STOP_CHECK_S))


JobWatch = Callable[[StageRequest, str, Callable[[], JobInfo]], JobInfo]
"""Wraps the wait for one job (request, job id, the wait itself) — e.g. in a Prefect task run named after
the job."""


class JobRunner:
    """A StageRunner that runs each stage as a job of `backend`, with resources from `profile`. `watch`, if
    set, wraps the wait for each job (submitted or re-attached to)."""

    resident = False  # every job loads policy k from the store
    job_function: JobFunction = staticmethod(run_stage_job)

    def __init__(self, backend: Backend, profile: ExecutionProfile, watch: JobWatch | None = None) -> None:
        self.backend, self.profile, self.watch = backend, profile, watch
        self.on_poll: Callable[[], bool] | None = None
        """Called at each poll of a job in flight; returns whether it saw something new (a commit), which
        counts as a change: the polls go back to their quickest."""
        self.pause: Callable[[float, Callable[[], bool]], None] = sleep_unless_stopped
        """Waits between two polls (seconds, the stop flag)."""
        self.submissions = 0
        """Jobs this runner submitted (re-attaching submits nothing)."""
        self._swept: set[str] = set()
        """Runs whose jobs that ended unwatched this runner has closed (once per run: `close_unwatched`)."""

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        store = ctx.store
        if request.run_id not in self._swept:
            self._swept.add(request.run_id)
            self._until_answered(
                ctx, "closing jobs that ended unwatched", lambda: close_unwatched(self, store, request)
            )
        job = self._until_answered(
            ctx, "looking for a job in flight", lambda: self._in_flight(store, request)
        )
        deaths = Deaths()
        while True:
            if job is None:
                job = self._submit(store, request, ctx)
            wait = functools.partial(self._wait, store, request, job, ctx)
            info = self.watch(request, str(job["job_id"]), wait) if self.watch else wait()
            ended = functools.partial(settle, self, store, request, job, info)
            outcome, progressed = self._until_answered(ctx, f"judging how job {job['job_id']} ended", ended)
            if outcome == JobOutcome.COMMITTED:
                return
            tail = self.backend.stderr_tail(Path(job["folder"]), job["job_id"])
            where = (
                f"{request.describe()}: job {job['job_id']} ended {info.state}"
                f"{f' (exit {info.exit_code})' if info.exit_code else ''}"
            )
            if outcome == JobOutcome.FAILED:
                raise StageFailed(f"{where}, the stage failed: {job['error']}; end of its stderr:\n{tail}")
            if outcome == JobOutcome.DIED:  # died without committing the stage (or never started)
                deaths.died(job["ended_at"], progressed, of_the_store=job.get("cause") == STORE_CAUSE)
                if too_many := deaths.too_many(self.profile.max_resubmits):
                    raise StageFailed(f"{where} without committing: {too_many}; end of its stderr:\n{tail}")
                if job.get("cause"):
                    log.warning(
                        "%s: %s; submitted again (death %d in a row)", where, job["cause"], deaths.count
                    )
            job = None

    def _until_answered(self, ctx: StageContext, doing: str, work: Callable[[], T]) -> T:
        """`work` (this waiting driver's reads and writes), tried again every poll_max_s while the store
        stays unreachable; a driver told to stop meanwhile stops (`probepo resume` goes on)."""

        def pause(seconds: float) -> bool:
            self.pause(seconds, ctx.should_stop)
            return not ctx.should_stop()

        try:
            return RIDER.until_answered(doing, work, pause, self.profile.poll_max_s)
        except StoreOutage:
            raise DriverStopped(f"the driver stops while the store is unreachable ({doing})") from None

    def judged(
        self, store: ArtifactStore, request: StageRequest, job: Mapping[str, Any]
    ) -> tuple[JobOutcome, dict[str, Any] | None]:
        """What an ended job's end means, from the store (never from the scheduler's state), and the job's
        last attempt record: the stage committed, failed with its own error, preempted, or died (a stage
        that failed only because the store stayed unreachable died: its job is submitted again)."""
        if self._finished(store, request):
            return JobOutcome.COMMITTED, None
        attempt = self._last_attempt(store, request, str(job["job_id"]))
        said = AttemptOutcome.of(attempt) if attempt else None
        if said == AttemptOutcome.FAILED and not failed_on_store(attempt):
            return JobOutcome.FAILED, attempt
        return (JobOutcome.PREEMPTED if said == AttemptOutcome.PREEMPTED else JobOutcome.DIED), attempt

    def progress(self, store: ArtifactStore, request: StageRequest) -> int:
        """How much of the stage's work is committed: the stage and its sub-stages (shards, parts, tree
        levels). Grows whenever a job commits any of it."""
        names = store.committed_stages(request.run_id, request.update)
        return sum(name == request.stage or name.startswith(f"{request.stage}.") for name in names)

    def open_jobs(self, store: ArtifactStore, run_id: str) -> list[dict[str, Any]]:
        """The run's jobs of this executor that no driver saw end (pending, running, or ended unseen)."""
        return [
            record
            for record in store.jobs(run_id)
            if record.get("outcome") == JobOutcome.OPEN and record.get("executor") == self.backend.name
        ]

    def cancel_jobs(self, store: ArtifactStore, run_id: str, jobs: list[dict[str, Any]]) -> None:
        """End these jobs of the run (scancel; SIGTERM for local ones) and close their records as
        cancelled. What they committed stays committed."""
        if jobs:
            self.backend.cancel([str(record["job_id"]) for record in jobs])
        for record in jobs:
            closed = {**record, "outcome": JobOutcome.CANCELLED, "ended_at": now()}
            store.record_job(
                run_id, record["update"], record["stage"], closed, submission_id=record["submission_id"]
            )

    @staticmethod
    def _finished(store: ArtifactStore, request: StageRequest) -> bool:
        return store.committed(request.run_id, request.update, request.stage)

    def _in_flight(self, store: ArtifactStore, request: StageRequest) -> dict[str, Any] | None:
        """The stage's last job if no driver saw it end (a driver restarted mid-stage re-attaches to it)."""
        records = [
            r
            for r in store.jobs(request.run_id, request.update, request.stage)
            if r.get("executor") == self.backend.name
        ]
        # An open record whose job has ended since is judged like any other ending, by `run`.
        job = records[-1] if records and records[-1].get("outcome") == JobOutcome.OPEN else None
        cancelled = [datetime.fromisoformat(c["at"]).timestamp() for c in store.cancellations(request.run_id)]
        if job is not None and cancelled and max(cancelled) >= job.get("submitted_epoch", 0.0):
            # the run was cancelled while this job was in flight, and its canceller died before ending it
            self.cancel_jobs(store, request.run_id, [job])
            return None
        return job

    def _submit(self, store: ArtifactStore, request: StageRequest, ctx: StageContext) -> dict[str, Any]:
        """Submit the stage's job and record it (the store read first: nothing is submitted while it is
        unreachable). The job rides out store outages up to the profile's store_outage_s, never past its
        time limit less its signal grace."""
        folder = Path(self.profile.job_folder).resolve() / request.run_id
        resources = self.profile.resources(request.stage)
        progress = self._until_answered(
            ctx, "reading the stage's progress", lambda: self.progress(store, request)
        )
        outage = OutageBudget(
            self.profile.store_outage_s, 60.0 * resources.time_min - resources.signal_grace_s
        )
        function = functools.partial(self.job_function, store_outage=outage)
        request = replace(request, signal_grace_s=resources.signal_grace_s)
        for attempt in range(1, SUBMIT_TRIES + 1):
            try:
                job_id = self.backend.submit(request, resources, folder, function)
                break
            except SubmitTransient as exc:
                if attempt == SUBMIT_TRIES:
                    raise SubmitFailed(
                        f"submitting {request.describe()} failed {SUBMIT_TRIES} times for reasons of the"
                        f" scheduler, the last: {exc}; check the cluster's state (sinfo, scontrol ping) and"
                        " resume the run"
                    ) from None
                time.sleep(self.profile.submit_retry_s * attempt)
        self.submissions += 1
        job: dict[str, Any] = {
            "executor": self.backend.name,
            "job_id": job_id,
            "state": "SUBMITTED",
            "node": None,
            "folder": str(folder),
            "submitted_at": now(),
            "submitted_epoch": time.time(),
            "resources": resources.model_dump(mode="json"),
            "outcome": JobOutcome.OPEN,
            "progress_at_submit": progress,
            "submission_id": new_attempt_id(),  # chosen here: a write tried again replaces, never adds
        }
        self._until_answered(ctx, f"recording job {job_id}", lambda: self._record(store, request, job))
        return job

    def _wait(
        self, store: ArtifactStore, request: StageRequest, job: dict[str, Any], ctx: StageContext
    ) -> JobInfo:
        """Poll until the job has ended, recording each change of state or node; while nothing changes, the
        polls back off from the profile's poll_s to its poll_max_s (Backoff)."""
        job_id = job["job_id"]
        backoff = Backoff(self.profile.poll_s, self.profile.poll_max_s)
        unrecorded = False
        while True:
            info = self.backend.states([job_id], {job_id: job.get("submitted_epoch", 0.0)})[job_id]
            changed = (info.state, info.node or None) != (job.get("state"), job.get("node"))
            if changed:
                job.update(state=info.state, node=info.node or None, elapsed=info.elapsed)
            within = self.profile.poll_max_s  # a poll waits for the store no longer: the job is watched on
            if changed or unrecorded:
                recorded = functools.partial(self._record, store, request, job)
                done, _ = RIDER.unless_unreachable(f"recording job {job_id}'s state", recorded, within)
                unrecorded = not done
            if self.on_poll is not None:
                changed = RIDER.unless_unreachable("following the run", self.on_poll, within)[1] or changed
            if not info.alive:
                return info
            if ctx.should_stop():
                raise DriverStopped(
                    f"the driver stops while job {job_id} runs {request.describe()}: the job goes on, and"
                    f" `probepo resume {request.run_id}` waits for it"
                )
            self.pause(backoff.after(changed), ctx.should_stop)

    @staticmethod
    def _last_attempt(store: ArtifactStore, request: StageRequest, job_id: str) -> dict[str, Any] | None:
        """The job's last attempt record at the stage (None: it never reported)."""
        said = [
            a
            for a in store.attempts(request.run_id, request.update, request.stage)
            if str(a.get("job_id")) == job_id
        ]
        return said[-1] if said else None

    def close(
        self,
        store: ArtifactStore,
        request: StageRequest,
        job: dict[str, Any],
        info: JobInfo,
        outcome: JobOutcome,
        **notes: str,
    ) -> None:
        """Record the job's end: its last state and exit code, what it meant, and `notes`."""
        job.update(state=info.state, exit_code=info.exit_code, outcome=outcome, ended_at=now(), **notes)
        self._record(store, request, job)

    @staticmethod
    def _record(store: ArtifactStore, request: StageRequest, job: dict[str, Any]) -> None:
        store.record_job(
            request.run_id,
            request.update,
            request.stage,
            {k: v for k, v in job.items() if k != "submission_id"},
            submission_id=job["submission_id"],
        )


class DriverJobRunner(JobRunner):
    """The resident executor: the driver itself runs as one SLURM job (resources: the profile's `driver`
    entry) that runs every stage left inline, its engines resident, so policy k + 1 goes from optimize to
    the next sample in memory and runs may checkpoint in full only every `checkpoint_every` updates. This
    process waits for the job as for a stage's (re-attaching to one in flight, submitting again one that
    died); a preempted job requeues itself and its driver resumes from the store."""

    resident = True
    job_function: JobFunction = staticmethod(run_driver_job)

    def run_driver(
        self, request: StageRequest, ctx: StageContext, on_poll: Callable[[], bool] | None = None
    ) -> None:
        self.on_poll = on_poll
        self.run(request, ctx)

    @staticmethod
    def _finished(store: ArtifactStore, request: StageRequest) -> bool:
        from probepo.run.pipeline import resume_point

        return resume_point(store, request.run_id, request.config).done

    def progress(self, store: ArtifactStore, request: StageRequest) -> int:
        """Everything the run has committed: the driver job runs every stage of every update."""
        return sum(len(names) for names in store.ledger_entries(request.run_id).values())

    @staticmethod
    def _last_attempt(store: ArtifactStore, request: StageRequest, job_id: str) -> dict[str, Any] | None:
        """The job's last attempt at any stage (the driver runs them all). A committed one does not count:
        a job that ended between two stages without finishing the run died, and is submitted again."""
        said = [a for a in store.attempts(request.run_id) if str(a.get("job_id")) == job_id]
        last = max(said, key=lambda a: str(a.get("start", ""))) if said else None
        return None if last is None or AttemptOutcome.of(last) == AttemptOutcome.COMMITTED else last

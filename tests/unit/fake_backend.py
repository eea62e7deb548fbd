"""A scripted backend for unit tests of the job runner, in the spirit of submitit's mocked-sbatch tests: no
scheduler, no subprocess. Each submission takes the next entry of a script: an exception that `submit`
raises (a refusal), or the polls of one job: the state each `states` call reports, and what the job has
written to the store by then (its attempt record, its commit), as a real job would."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probepo.config import StageResources
from probepo.run.execution import StageRequest
from probepo.store import ArtifactStore, AttemptOutcome
from slurm.accounting import JobInfo
from slurm.backends import JobFunction

ERROR = "ZeroDivisionError: division by zero"
"""The error a FAILED attempt of a scripted job records."""


@dataclass(frozen=True)
class Poll:
    """What one poll of a job sees: its state and exit code, and what it wrote since the poll before."""

    state: str
    attempt: AttemptOutcome | None = None
    """An attempt record the job wrote (with its job id), FAILED ones with ERROR."""
    commit: bool = False
    """The job committed its stage."""
    shard: bool = False
    """The job committed a shard of its stage (part of its work: `<stage>.shard-NNNN`, the next number)."""
    exit_code: str = ""


def job(*polls: Poll | str) -> list[Poll]:
    """A job's polls; a bare state is a poll with nothing written. The last poll repeats forever."""
    return [Poll(p) if isinstance(p, str) else p for p in polls]


def committing() -> list[Poll]:
    done = Poll("COMPLETED", AttemptOutcome.COMMITTED, commit=True, exit_code="0:0")
    return job("PENDING", "RUNNING", done)


def killed(after_a_shard: bool = False) -> list[Poll]:
    """Killed outright while running (SIGKILL, node failure): no attempt outcome, no commit of its stage;
    `after_a_shard`: once it committed a shard of it."""
    return job(Poll("RUNNING", shard=after_a_shard), Poll("FAILED", AttemptOutcome.RUNNING, exit_code="0:9"))


@dataclass
class FakeJob:
    request: StageRequest
    polls: list[Poll]
    seen: int = 0
    cancelled: bool = False


@dataclass
class FakeBackend:
    """Runs `script` (one entry per submission, in order) against `store`."""

    store: ArtifactStore
    script: list[list[Poll] | Exception]
    name: str = "fake"
    job_id_variable: str = "FAKE_JOB_ID"
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    forgotten: set[str] = field(default_factory=set)
    """Jobs it reports no state of (as sacct once its accounting of them is purged)."""

    def check(self, stages: Iterable[str] = ()) -> None:
        """Nothing to check."""

    def submit(
        self, request: StageRequest, resources: StageResources, folder: Path, function: JobFunction
    ) -> str:
        entry = self.script.pop(0)
        if isinstance(entry, Exception):
            raise entry
        job_id = str(1000 + len(self.jobs))
        self.jobs[job_id] = FakeJob(request, entry)
        return job_id

    def submit_arrays(
        self,
        function: Callable[[Any], Any],
        items: Sequence[Any],
        resources: StageResources,
        folder: Path,
        parallelism: int | None = None,
    ) -> list[list[Any]]:
        raise NotImplementedError("the job runner submits no arrays")

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        return {job_id: self._poll(job_id) for job_id in job_ids if job_id not in self.forgotten}

    def _poll(self, job_id: str) -> JobInfo:
        job = self.jobs[job_id]
        if job.cancelled:
            return JobInfo(job_id, "CANCELLED", "0:15", "fake-node")
        poll = job.polls[min(job.seen, len(job.polls) - 1)]
        if job.seen < len(job.polls):  # what the job writes happens once
            request = job.request
            if poll.attempt is not None:
                record: dict[str, Any] = {"job_id": job_id, "outcome": poll.attempt}
                if poll.attempt == AttemptOutcome.FAILED:
                    record["error"] = ERROR
                self.store.record_attempt(request.run_id, request.update, request.stage, record)
            if poll.commit:
                self.store.commit_stage(request.run_id, request.update, request.stage, {"out.txt": b"1"})
            if poll.shard:
                made = self.store.committed_stages(request.run_id, request.update)
                shard = f"{request.stage}.shard-{sum('.shard-' in name for name in made):04d}"
                self.store.commit_stage(request.run_id, request.update, shard, {"out.txt": b"1"})
        job.seen += 1
        return JobInfo(job_id, poll.state, poll.exit_code, "fake-node")

    def cancel(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self.jobs[job_id].cancelled = True
            self.cancelled.append(job_id)

    def costs(self, job_ids: Iterable[str]) -> None:
        return None

    def stderr_tail(self, folder: Path, job_id: str, lines: int = 15) -> str:
        return f"Traceback (most recent call last):\n{ERROR}\n(stderr of fake job {job_id})"

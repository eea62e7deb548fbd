"""The job runner's decisions on a scripted backend (tests/unit/fake_backend.py), each in well under a
second: transient refusals retried, then SubmitFailed; a job that died submitted again up to
max_resubmits in a row, then StageFailed naming the job (a death after a commit of the job's work starts
the count over); a stage's own failure never resubmitted; a requeued job waited on; a restarted driver
re-attaching, and closing the records of jobs that ended while no driver watched (a job the backend
reports no state of left open); a cancel; polls that back off while nothing changes. The same
runner on the real cluster: tests/slurm/."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from probepo.config import ExecutionProfile, RunConfig
from probepo.run.execution import StageRequest
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, AttemptOutcome, JobOutcome, open_store
from slurm.backends import SubmitFailed, SubmitRefused, SubmitTransient
from slurm.runner import (
    SUBMIT_TRIES,
    DriverJobRunner,
    DriverStopped,
    JobRunner,
    StageFailed,
    sleep_unless_stopped,
)
from tests.unit.fake_backend import ERROR, FakeBackend, Poll, committing, job, killed

RUN = "fake-run"
PROFILE = ExecutionProfile(poll_s=0.001, submit_retry_s=0, max_resubmits=2)


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return open_store(tmp_path / "store")


def _stage(store: ArtifactStore, tmp_path: Path, stop: bool = False) -> tuple[StageRequest, StageContext]:
    config = RunConfig()
    ctx = StageContext(store, RUN, 3, config, tmp_path, should_stop=lambda: stop)
    return StageRequest.of(ctx, Stage.SAMPLE), ctx


def _outcomes(store: ArtifactStore) -> list[str]:
    return [record["outcome"] for record in store.jobs(RUN, 3, Stage.SAMPLE)]


def test_a_committing_job_is_submitted_once_and_recorded(store, tmp_path):
    backend = FakeBackend(store, [committing()])
    runner = JobRunner(backend, PROFILE)
    runner.run(*_stage(store, tmp_path))
    assert runner.submissions == 1 and store.committed(RUN, 3, Stage.SAMPLE)
    [record] = store.jobs(RUN, 3, Stage.SAMPLE)
    assert (record["outcome"], record["state"], record["executor"]) == ("committed", "COMPLETED", "fake")


def test_transient_refusals_are_retried_then_submit_failed(store, tmp_path):
    flaky = [SubmitTransient("sbatch: Socket timed out on send/recv operation")] * (SUBMIT_TRIES - 1)
    runner = JobRunner(FakeBackend(store, [*flaky, committing()]), PROFILE)
    runner.run(*_stage(store, tmp_path))  # the last try goes through
    assert runner.submissions == 1 and store.committed(RUN, 3, Stage.SAMPLE)

    down = FakeBackend(store, [SubmitTransient("sbatch: Unable to contact slurm controller")] * SUBMIT_TRIES)
    request, ctx = _stage(store, tmp_path)
    request = StageRequest(request.store_url, RUN, 4, Stage.SAMPLE, request.config_json)
    refused = rf"failed {SUBMIT_TRIES} times.*Unable to contact slurm controller"
    with pytest.raises(SubmitFailed, match=refused):
        JobRunner(down, PROFILE).run(request, ctx)
    assert down.script == [] and store.jobs(RUN, 4) == []  # nothing recorded: nothing was submitted


def test_a_refusal_is_not_retried(store, tmp_path):
    backend = FakeBackend(store, [SubmitRefused("sbatch refused: Invalid partition name"), committing()])
    with pytest.raises(SubmitRefused, match="Invalid partition"):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path))
    assert len(backend.script) == 1


def test_a_job_that_dies_is_resubmitted_up_to_max_resubmits_then_stage_failed(store, tmp_path):
    backend = FakeBackend(store, [killed(), killed(), committing()])
    runner = JobRunner(backend, PROFILE)
    runner.run(*_stage(store, tmp_path))
    assert runner.submissions == 3 and _outcomes(store) == ["died", "died", "committed"]

    request, ctx = _stage(store, tmp_path)
    request = StageRequest(request.store_url, RUN, 5, Stage.SAMPLE, request.config_json)
    backend = FakeBackend(store, [killed() for _ in range(PROFILE.max_resubmits + 2)])
    with pytest.raises(StageFailed) as failed:
        JobRunner(backend, PROFILE).run(request, ctx)
    message = str(failed.value)
    assert (
        "job 1002 ended FAILED (exit 0:9) without committing: 3 deaths in a row since 20" in message
        and "none after a commit of its work (max_resubmits = 2)" in message
    )
    assert f"stderr:\nTraceback (most recent call last):\n{ERROR}\n(stderr of fake job 1002)" in message
    assert len(backend.jobs) == PROFILE.max_resubmits + 1 and not failed.value.user_error


def test_a_death_after_a_commit_of_the_jobs_work_starts_the_count_over(store, tmp_path):
    """Deaths count in a row: a job that committed a shard before it died made progress, so a long stage
    (or the resident job, a whole run) is not stopped by deaths days apart, only by max_resubmits + 1 with
    nothing committed between."""
    progressing = [killed(after_a_shard=True) for _ in range(PROFILE.max_resubmits + 2)]
    runner = JobRunner(FakeBackend(store, [*progressing, committing()]), PROFILE)
    runner.run(*_stage(store, tmp_path))
    assert _outcomes(store) == ["died"] * (PROFILE.max_resubmits + 2) + ["committed"]

    request, ctx = _stage(store, tmp_path)
    request = StageRequest(request.store_url, RUN, 6, Stage.SAMPLE, request.config_json)
    backend = FakeBackend(store, [killed(after_a_shard=True), killed(), killed(), killed(), committing()])
    with pytest.raises(StageFailed, match=r"job 1002 .* 3 deaths in a row since"):
        JobRunner(backend, PROFILE).run(request, ctx)  # the first death (after a shard) starts the row
    assert len(backend.script) == 2


def test_the_resident_job_counts_deaths_since_its_last_commit_of_any_stage(store, tmp_path):
    """The resident job runs the whole run: any stage it committed before it died (here a sub-stage of
    its own) starts the count over, so a run of weeks survives any number of deaths days apart."""
    ctx = StageContext(store, RUN, 0, RunConfig(), tmp_path, should_stop=lambda: False)
    request = StageRequest.of(ctx, Stage.DRIVER)
    failing = job("RUNNING", Poll("FAILED", AttemptOutcome.FAILED, exit_code="1:0"))
    progressing = [killed(after_a_shard=True) for _ in range(PROFILE.max_resubmits + 2)]
    backend = FakeBackend(store, [*progressing, failing])
    with pytest.raises(StageFailed, match="the stage failed"):  # not the deaths: each made progress
        DriverJobRunner(backend, PROFILE).run(request, ctx)
    assert len(backend.jobs) == PROFILE.max_resubmits + 3
    backend = FakeBackend(store, [killed() for _ in range(PROFILE.max_resubmits + 1)])
    with pytest.raises(StageFailed, match=r"3 deaths in a row since .*, none after a commit of its work"):
        DriverJobRunner(backend, PROFILE).run(request, ctx)


def test_a_resumed_driver_closes_the_records_of_jobs_that_ended_unwatched(store, tmp_path):
    """A driver killed while its job ran leaves the record open; the job went on and committed. The next
    driver closes that record from what the store says the job did, whatever stage it resumes at."""
    backend = FakeBackend(store, [job("RUNNING", Poll("COMPLETED", AttemptOutcome.COMMITTED, commit=True))])
    with pytest.raises(DriverStopped):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path, stop=True))
    assert _outcomes(store) == ["open"]
    backend.script.append(committing())  # the next stage's job
    request, ctx = _stage(store, tmp_path)
    JobRunner(backend, PROFILE).run(replace(request, stage=Stage.PROBE), ctx)
    [closed] = store.jobs(RUN, 3, Stage.SAMPLE)
    assert (closed["outcome"], closed["state"], closed["unwatched"]) == ("committed", "COMPLETED", "true")
    assert [r["outcome"] for r in store.jobs(RUN, 3, Stage.PROBE)] == ["committed"]


def test_a_job_the_backend_knows_no_state_of_stays_open_and_is_logged(store, tmp_path, caplog):
    """A backend may report nothing of a job (sacct once its accounting is purged): the resumed driver
    leaves that record open, says so in its log, and goes on with the stage at hand."""
    backend = FakeBackend(store, [job("RUNNING", Poll("COMPLETED", AttemptOutcome.COMMITTED, commit=True))])
    with pytest.raises(DriverStopped):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path, stop=True))
    backend.forgotten.add("1000")
    backend.script.append(committing())
    request, ctx = _stage(store, tmp_path)
    with caplog.at_level("WARNING", logger="slurm.job_ends"):
        JobRunner(backend, PROFILE).run(replace(request, stage=Stage.PROBE), ctx)
    assert _outcomes(store) == ["open"]
    assert [r["outcome"] for r in store.jobs(RUN, 3, Stage.PROBE)] == ["committed"]
    (said,) = caplog.messages
    assert said.startswith(f"run {RUN}: sample's job 1000 of update 3 (") and "fake reports no state" in said
    assert said.endswith("its record stays open")


def test_a_resumed_driver_still_reports_the_failure_of_the_stage_it_resumes_at(store, tmp_path):
    """The record of the stage at hand is left to `run`, which re-attaches to its ended job and judges it
    as a watched ending: a stage's own failure is reported, never submitted again."""
    failing = job("RUNNING", Poll("FAILED", AttemptOutcome.FAILED, exit_code="1:0"))
    backend = FakeBackend(store, [failing, committing()])
    with pytest.raises(DriverStopped):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path, stop=True))
    with pytest.raises(StageFailed, match=rf"job 1000 ended FAILED \(exit 1:0\), the stage failed: {ERROR}"):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path))
    assert _outcomes(store) == ["failed"] and len(backend.jobs) == 1


def test_a_stage_that_fails_with_its_own_error_is_not_resubmitted(store, tmp_path):
    failing = job("RUNNING", Poll("FAILED", AttemptOutcome.FAILED, exit_code="1:0"))
    backend = FakeBackend(store, [failing, committing()])
    with pytest.raises(StageFailed, match=rf"job 1000 ended FAILED \(exit 1:0\), the stage failed: {ERROR}"):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path))
    [record] = store.jobs(RUN, 3, Stage.SAMPLE)
    assert (record["outcome"], record["error"]) == (JobOutcome.FAILED, ERROR) and len(backend.script) == 1


def test_a_requeued_job_is_waited_on_not_resubmitted(store, tmp_path):
    requeued = job(
        "PENDING",
        "RUNNING",
        Poll("REQUEUED", AttemptOutcome.PREEMPTED),  # preempted at a safe point, back in the queue
        "PENDING",
        "RUNNING",
        Poll("COMPLETED", AttemptOutcome.COMMITTED, commit=True),
    )
    runner = JobRunner(FakeBackend(store, [requeued]), PROFILE)
    runner.run(*_stage(store, tmp_path))
    assert runner.submissions == 1 and _outcomes(store) == ["committed"]


def test_a_preempted_job_that_ended_is_submitted_again_without_counting_as_died(store, tmp_path):
    preempted = [job("RUNNING", Poll("COMPLETED", AttemptOutcome.PREEMPTED)) for _ in range(4)]
    runner = JobRunner(FakeBackend(store, [*preempted, committing()]), PROFILE)  # 4 > max_resubmits
    runner.run(*_stage(store, tmp_path))
    assert _outcomes(store) == ["preempted"] * 4 + ["committed"]


def test_a_restarted_driver_reattaches_to_the_job_in_flight(store, tmp_path):
    backend = FakeBackend(store, [job("PENDING", *["RUNNING"] * 3, Poll("COMPLETED", commit=True))])
    with pytest.raises(
        DriverStopped, match=r"job 1000 runs stage sample of update 3.*probepo resume fake-run"
    ):
        JobRunner(backend, PROFILE).run(*_stage(store, tmp_path, stop=True))
    assert _outcomes(store) == ["open"]
    restarted = JobRunner(backend, PROFILE)  # a new driver process, the same cluster
    restarted.run(*_stage(store, tmp_path))
    assert restarted.submissions == 0 and _outcomes(store) == ["committed"] and len(backend.jobs) == 1


def test_cancel_ends_the_open_jobs_and_closes_their_records(store, tmp_path):
    backend = FakeBackend(store, [job("RUNNING")])
    runner = JobRunner(backend, PROFILE)
    with pytest.raises(DriverStopped):
        runner.run(*_stage(store, tmp_path, stop=True))
    open_jobs = runner.open_jobs(store, RUN)
    assert [record["job_id"] for record in open_jobs] == ["1000"]
    runner.cancel_jobs(store, RUN, open_jobs)
    assert backend.cancelled == ["1000"] and _outcomes(store) == ["cancelled"]
    assert runner.open_jobs(store, RUN) == []


def _pauses(runner: JobRunner) -> list[float]:
    """The waits `runner` makes between polls, recorded instead of slept."""
    waits: list[float] = []
    runner.pause = lambda seconds, should_stop: waits.append(seconds)
    return waits


def test_polls_back_off_while_a_job_stays_running_and_start_over_after_a_change(store, tmp_path):
    profile = ExecutionProfile(poll_s=1.0, poll_max_s=2.0)
    requeued = job(
        "PENDING",
        *["RUNNING"] * 5,
        Poll("REQUEUED", AttemptOutcome.PREEMPTED),
        "PENDING",
        "RUNNING",
        "RUNNING",
        Poll("COMPLETED", AttemptOutcome.COMMITTED, commit=True),
    )
    runner = JobRunner(FakeBackend(store, [requeued]), profile)
    waits = _pauses(runner)
    runner.run(*_stage(store, tmp_path))
    grown = [1.25, 1.25**2, 1.25**3, 2.0]  # after PENDING and RUNNING (changes), 4 unchanged RUNNING polls
    assert waits == [1.0, 1.0, *grown, 1.0, 1.0, 1.0, 1.25]  # REQUEUED, PENDING, RUNNING: back to poll_s


def test_a_commit_seen_while_the_job_runs_starts_the_polls_over(store, tmp_path):
    runner = JobRunner(
        FakeBackend(store, [job(*["RUNNING"] * 5, Poll("COMPLETED", commit=True))]),
        ExecutionProfile(poll_s=1.0, poll_max_s=60.0),
    )
    waits = _pauses(runner)
    commits_seen = iter([False, False, True, False, False, False])  # the resident job's metrics, say
    runner.on_poll = lambda: next(commits_seen)
    runner.run(*_stage(store, tmp_path))
    assert waits == [1.0, 1.25, 1.0, 1.25, 1.25**2]


def test_a_long_wait_ends_as_soon_as_the_driver_is_told_to_stop():
    started = time.monotonic()
    sleep_unless_stopped(600.0, lambda: True)
    assert time.monotonic() - started < 0.5
    with pytest.raises(ValueError, match=r"poll_max_s = 0\.5 is below poll_s = 1\.0"):
        ExecutionProfile(poll_s=1.0, poll_max_s=0.5)

"""An array task's stop (slurm/job.py: AbandoningStop, run_array_task): USR2 or SIGTERM abandons the work at
once, but never a commit in progress, which ends first; the task then requeues itself when it committed
something or has not been requeued too often, and otherwise fails saying why, its progress kept. The real
requeue after a preemption and at a time limit's warning: tests/slurm/test_nightly.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

import slurm.job
from probepo.run.preemption import PREEMPTED_EXIT, Preempted
from slurm.job import AbandoningStop, TaskAbandoned


@pytest.fixture
def requeues(monkeypatch) -> list[bool]:
    asked: list[bool] = []
    monkeypatch.setattr(AbandoningStop, "install", lambda self: self)  # no handlers in the test process
    monkeypatch.setattr(slurm.job, "node_local_caches", dict)  # nor cache variables in its environment
    monkeypatch.setattr(slurm.job, "requeue_self", lambda: asked.append(True) or True)
    return asked


@pytest.fixture
def handlers_restored() -> Iterator[None]:
    """The test process's own USR2 and SIGTERM handlers, put back after a test installs an AbandoningStop."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_signal_abandons_the_work_at_once_but_lets_a_commit_end_first(handlers_restored):
    done: list[str] = []
    flag = AbandoningStop().install()
    with pytest.raises(TaskAbandoned, match="after 1 commits"), flag.held():
        signal.raise_signal(signal.SIGUSR2)  # mid-commit: the commit ends, then the task is abandoned
        done.append("committed")
    assert done == ["committed"] and flag() and flag.commits == 1
    signal.raise_signal(signal.SIGTERM)  # abandoned once: `scontrol requeue`'s SIGTERM only raises the flag

    flag = AbandoningStop().install()
    with pytest.raises(TaskAbandoned, match="after 0 commits"):
        signal.raise_signal(signal.SIGTERM)  # an engine call, a download, the grading: given up at once
        done.append("went on")
    assert done == ["committed"] and flag.commits == 0


def _abandoned(commits: int):
    def work(item: int, should_stop: AbandoningStop) -> int:
        for _ in range(commits):
            with should_stop.held():
                pass
        should_stop.signalled(signal.SIGUSR2, None)  # as the time limit's warning does, mid-work
        raise AssertionError("the signal did not abandon the work")

    return work


def _stops(progressed: bool):
    def work(item: int, should_stop) -> int:
        raise Preempted(f"item {item} stopped", progressed=progressed)

    return work


def test_a_task_that_committed_something_requeues_however_often_it_ran(requeues, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "40")
    for work in (_abandoned(commits=1), _stops(progressed=True)):
        with pytest.raises(SystemExit) as ended:
            slurm.job.run_array_task(work, 3)
        assert ended.value.code == PREEMPTED_EXIT
    assert requeues == [True, True]
    assert slurm.job.run_array_task(lambda item, should_stop: item * 2, 3) == 6


def test_a_task_that_commits_nothing_gives_up_after_its_requeues(requeues, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(slurm.job.RESTARTS_BEFORE_GIVING_UP - 1))
    with pytest.raises(SystemExit):
        slurm.job.run_array_task(_abandoned(commits=0), 3)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(slurm.job.RESTARTS_BEFORE_GIVING_UP))
    with pytest.raises(RuntimeError, match="after 0 commits of this run; stopped after 3 requeues without"):
        slurm.job.run_array_task(_abandoned(commits=0), 3)
    with pytest.raises(RuntimeError, match="item 3 stopped; stopped after 3 requeues without committing"):
        slurm.job.run_array_task(_stops(progressed=False), 3)
    assert len(requeues) == 1

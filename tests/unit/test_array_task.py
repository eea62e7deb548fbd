"""An array task stopped at a safe point (slurm/job.py: run_array_task): it requeues itself when it kept
something or has not been requeued too often, and otherwise fails saying why, its progress kept. The real
requeue after a preemption: tests/slurm/test_nightly.py."""

from __future__ import annotations

import pytest

import slurm.job
from probepo.preemption import PREEMPTED_EXIT, Preempted, StopFlag


@pytest.fixture
def requeues(monkeypatch) -> list[bool]:
    asked: list[bool] = []
    monkeypatch.setattr(slurm.job, "_install_stop_flag", StopFlag)  # no handlers in the test process
    monkeypatch.setattr(slurm.job, "requeue_self", lambda: asked.append(True) or True)
    return asked


def _stops(progressed: bool):
    def work(item: int, should_stop) -> int:
        raise Preempted(f"item {item} stopped", progressed=progressed)

    return work


def test_a_task_that_kept_a_shard_requeues_however_often_it_ran(requeues, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "40")
    with pytest.raises(SystemExit) as ended:
        slurm.job.run_array_task(_stops(progressed=True), 3)
    assert ended.value.code == PREEMPTED_EXIT and requeues == [True]
    assert slurm.job.run_array_task(lambda item, should_stop: item * 2, 3) == 6


def test_a_task_that_keeps_nothing_gives_up_after_its_requeues(requeues, monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(slurm.job.RESTARTS_BEFORE_GIVING_UP - 1))
    with pytest.raises(SystemExit):
        slurm.job.run_array_task(_stops(progressed=False), 3)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(slurm.job.RESTARTS_BEFORE_GIVING_UP))
    with pytest.raises(RuntimeError, match="item 3 stopped; stopped after 3 requeues without keeping"):
        slurm.job.run_array_task(_stops(progressed=False), 3)
    assert len(requeues) == 1

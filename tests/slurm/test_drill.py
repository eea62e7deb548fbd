"""The preemption drill on real SLURM daemons: every stage a job, each case alone and then all in one run.
Every case: the run completes, no stage is committed twice, no update is lost, and the final checkpoint is
bitwise the inline run's.

(a) a stage paused at a safe point is preempted by a job of the high partition (USR2 -> partial commit ->
the job requeues itself -> it resumes from the commit); (b) `scontrol requeue` from outside (no warning:
the job starts over from what is committed); (c) SIGKILL of a stage job's process (the driver sees the job
fail without committing and submits it again); (d) SIGKILL of the driver while a stage job runs, then
`probepo resume` re-attaches and submits nothing for that stage; (e) the node set DOWN under a running
job, then back (SLURM requeues it).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.slurm.conftest import drill_config
from tests.slurm.drill import Drill, slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

AFTER_FIRST_MINIBATCH = "0:optimize.minibatch-0000:done"  # where a stop commits the first part


@pytest.fixture
def drill(warm_store, tmp_path, profile_path, request) -> Drill:
    return Drill(warm_store, f"drill-{request.node.name[5:40]}", tmp_path, profile_path, drill_config())


def preempt_with_a_high_job() -> None:
    """A job of the high partition that needs the whole node: SLURM preempts (requeues) the low ones."""
    slurm("sbatch", "-p", "high", "--exclusive", "-o", "/dev/null", "-J", "drill-high", "--wrap", "sleep 3")


def node() -> str:
    return os.environ.get("PROBEPO_SLURM_NODE", "probepo-node1")


def test_a_preempted_stage_commits_requeues_and_resumes(drill, drill_baseline):
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    preempt_with_a_high_job()
    drill.finish()
    drill.check(drill_baseline)
    outcomes = [a["outcome"] for a in drill.store.attempts(drill.run_id, 0, "optimize")]
    assert outcomes == ["preempted", "committed"]
    assert drill.submissions(0, "optimize") == 1  # the same job, requeued by itself
    resumed = drill.store.attempts(drill.run_id, 0, "optimize")[-1]
    assert resumed["resumed_at_minibatch"] == 1 and resumed["job_id"] == drill.job_id(0, "optimize")


def test_a_job_requeued_from_outside_starts_over_from_the_store(drill, drill_baseline):
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    slurm("scontrol", "requeue", drill.job_id(0, "optimize"))
    drill.release.touch()  # the job's next run may start the optimizer over (no part): past the pause
    drill.finish()
    drill.check(drill_baseline)
    assert drill.submissions(0, "optimize") == 1
    assert drill.store.attempts(drill.run_id, 0, "optimize")[-1]["outcome"] == "committed"


def test_a_killed_job_is_seen_dead_and_submitted_again(drill, drill_baseline):
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    os.kill(drill.paused_at(AFTER_FIRST_MINIBATCH), signal.SIGKILL)
    drill.release.touch()  # a hard death reruns the optimizer from mini-batch 0: past the pause this time
    drill.finish()
    drill.check(drill_baseline)
    assert drill.submissions(0, "optimize") == 2
    died = drill.store.jobs(drill.run_id, 0, "optimize")[0]
    assert died["outcome"] == "died" and died["state"] == "FAILED"


def test_a_killed_driver_is_resumed_by_one_that_reattaches(drill, drill_baseline):
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    drill.kill_driver()
    drill.resume()
    # The new driver finds the stage's job in flight and waits for it: no second submission.
    drill.release.touch()
    drill.finish()
    drill.check(drill_baseline)
    assert drill.submissions(0, "optimize") == 1
    assert [a["outcome"] for a in drill.store.attempts(drill.run_id, 0, "optimize")] == ["committed"]


def test_a_job_whose_node_goes_down_is_requeued_by_slurm(drill, drill_baseline):
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    drill.node_down_under(drill.job_id(0, "optimize"), node())
    drill.release.touch()  # the job's next run may start the optimizer over (no part): past the pause
    drill.finish()
    drill.check(drill_baseline)
    assert drill.submissions(0, "optimize") == 1


def test_every_case_in_one_run(drill, drill_baseline):
    points = {
        "preempt": "0:sample.shard-0000:after-commit",
        "requeue": "0:score:after-commit",
        "kill-job": "0:probe.shard-0000:after-commit",
        "node-down": "0:advantage:after-commit",
        "kill-driver": AFTER_FIRST_MINIBATCH,
    }
    drill.pause = tuple(points.values())
    drill.train()
    drill.paused_at(points["preempt"])
    preempt_with_a_high_job()
    drill.paused_at(points["requeue"])
    slurm("scontrol", "requeue", drill.job_id(0, "score"))
    os.kill(drill.paused_at(points["kill-job"]), signal.SIGKILL)
    drill.paused_at(points["node-down"])
    drill.node_down_under(drill.job_id(0, "advantage"), node())
    drill.paused_at(points["kill-driver"])
    drill.kill_driver()
    drill.resume()
    drill.release.touch()
    drill.finish()
    drill.check(drill_baseline)
    submitted = {
        stage: drill.submissions(0, stage) for stage in ("sample", "score", "probe", "advantage", "optimize")
    }
    assert submitted == {"sample": 1, "score": 1, "probe": 2, "advantage": 1, "optimize": 1}

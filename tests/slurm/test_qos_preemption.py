"""A site that preempts by QOS (`PreemptType=preempt/qos`), on a controller of the cluster in a box of its own
(infra/slurm/clusters/qos.env: one node, partition batch with GraceTime 0, QOS standby — everyone's default,
GraceTime 60 s — preempted by QOS urgent). SLURM's preempt/qos plugin takes a preempted job's grace from its
QOS alone: `probepo check` reads it there, and a stage job and a resident driver preempted through their QOS
commit, requeue themselves and end bitwise equal to an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from slurm.check import check_launch
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config, tiny_config
from tests.slurm.conftest import drill_config
from tests.slurm.drill import Drill, accounted_states, slurm
from tests.slurm.test_drill import AFTER_FIRST_MINIBATCH

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _profile(tmp_path: Path, **defaults: object) -> Path:
    """Every stage in the cluster's default partition (batch) under the user's default QOS unless
    `defaults` say otherwise."""
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        poll_s=0.3,
        poll_max_s=0.3,
        defaults=StageResources.model_validate({"time_min": 15, "signal_grace_s": 30, **defaults}),
    )
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    return path


def preempt_with_an_urgent_job() -> None:
    """A job of QOS urgent that needs the whole node: SLURM preempts (requeues) the standby jobs on it."""
    slurm(
        "sbatch", "--qos=urgent", "--exclusive", "-o", "/dev/null", "-J", "drill-urgent", "--wrap", "sleep 3"
    )


def test_check_reads_the_grace_time_from_the_jobs_qos_not_the_partition(slurm_cluster, tmp_path):
    recipe = tiny_config("probepo", store=str(tmp_path / "store")).model_dump(mode="json")
    found = check_launch(recipe, "slurm", _profile(tmp_path)).findings
    assert found.failures == [] and found.warnings == []  # the partition's GraceTime of 0 plays no part
    assert (
        "preemption: preempt/qos: QOS standby (GraceTime 60 s) send the job's USR2 at preemption, then kill"
        " after GraceTime" in found.passed
    )

    (failure,) = check_launch(recipe, "slurm", _profile(tmp_path, signal_grace_s=120)).findings.failures
    assert failure.startswith(
        "defaults: signal_grace_s = 120 s is longer than QOS standby's GraceTime (60 s)"
    )
    assert failure.endswith("ask the admins for a GraceTime on the QOS of at least signal_grace_s")

    # a QOS no other QOS preempts: any grace will do
    unpreempted = check_launch(recipe, "slurm", _profile(tmp_path, signal_grace_s=120, qos="normal")).findings
    assert unpreempted.failures == []
    assert "preemption: the profile's stages are not preempted" in unpreempted.passed


def test_a_stage_preempted_through_its_qos_commits_requeues_and_resumes(
    slurm_cluster, warm_store, drill_baseline, tmp_path
):
    drill = Drill(warm_store, "qos-drill", tmp_path, _profile(tmp_path), drill_config())
    drill.pause = (AFTER_FIRST_MINIBATCH,)
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    preempt_with_an_urgent_job()
    drill.finish()
    drill.check(drill_baseline)
    outcomes = [a["outcome"] for a in drill.store.attempts(drill.run_id, 0, "optimize")]
    assert outcomes == ["preempted", "committed"]
    assert drill.submissions(0, "optimize") == 1  # the same job, requeued by itself
    job_id = drill.job_id(0, "optimize")
    # signalled at preemption, it committed and requeued itself within standby's grace, before any kill
    assert accounted_states(job_id) == ["REQUEUED", "COMPLETED"]
    assert slurm("sacct", "-j", job_id, "-n", "-X", "-P", "-o", "QOS").split() == ["standby"]


def test_a_resident_driver_preempted_through_its_qos_requeues_and_replays(
    slurm_cluster, warm_store, tmp_path, every_update_reference
):
    """Preempted between two full checkpoints (policy 2 lives only in the job's memory), the driver commits
    at its next stage boundary, requeues itself, and replays optimize 0 and 1 from the store."""
    pause = "1:optimize:before-commit"
    drill = Drill(
        warm_store, "qos-resident", tmp_path, _profile(tmp_path), every_config(3), executor="resident"
    )
    drill.pause = (pause,)
    drill.train()
    drill.paused_at(pause)
    job_id = drill.job_id(0, "driver")
    preempt_with_an_urgent_job()
    drill.finish()

    final = warm_store.read_stage(drill.run_id, LONG_UPDATES, "checkpoint")
    assert {name: final[name] for name in FINAL_FILES} == every_update_reference
    assert [job["job_id"] for job in warm_store.jobs(drill.run_id, 0, "driver")] == [job_id]
    assert accounted_states(job_id) == ["REQUEUED", "COMPLETED"]
    attempts = warm_store.attempts(drill.run_id)
    assert [a.get("replayed_updates") for a in attempts if a.get("replayed_updates")] == [2]
    for update, stages in warm_store.ledger_entries(drill.run_id).items():
        for stage in stages:
            outcomes = [a["outcome"] for a in warm_store.attempts(drill.run_id, update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)

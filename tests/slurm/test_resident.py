"""The resident executor on the real SLURM cluster: the driver itself is one job that runs every stage with
its engines resident, so a run may checkpoint in full every 3 updates only. Preempted between two full
checkpoints (policy 2 exists only in the job's memory), the job commits at the next stage boundary and
requeues itself; run again, its driver replays optimize 0 and 1 from the store and goes on. The process
that submitted it is killed meanwhile, and `probepo resume --executor resident` re-attaches to the same job
instead of submitting a second. The final checkpoint is bitwise the inline checkpoint-every-update run's.
A checkpoint uploading beside the updates when the driver is preempted (it cannot land within the grace:
abandoned) or killed outright: never visible, the run resumed from the checkpoint before, bitwise.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from probepo.store.keys import RunLayout
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config
from tests.slurm.drill import Drill, slurm
from tests.slurm.test_drill import preempt_with_a_high_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PAUSE = "1:optimize:before-commit"  # the last commit of update 1, whose policy 2 is never committed in full


def test_a_preempted_driver_job_requeues_replays_and_is_reattached(
    warm_store, tmp_path, profile_path, every_update_reference
):
    drill = Drill(warm_store, "resident-drill", tmp_path, profile_path, every_config(3), executor="resident")
    drill.pause = (PAUSE,)
    drill.train()
    drill.paused_at(PAUSE)
    job_id = drill.job_id(0, "driver")
    drill.kill_driver()  # the submitting process dies; the job goes on
    preempt_with_a_high_job()
    drill.pause = ()
    drill.resume()
    drill.finish()

    final = warm_store.read_stage(drill.run_id, LONG_UPDATES, "checkpoint")
    assert {name: final[name] for name in FINAL_FILES} == every_update_reference
    entries = warm_store.ledger_entries(drill.run_id)
    assert [u for u, stages in entries.items() if "checkpoint" in stages] == [0, 3, 5]
    # One job ran the whole run, twice (requeued by itself after the preemption), never submitted again.
    assert [job["job_id"] for job in warm_store.jobs(drill.run_id, 0, "driver")] == [job_id]
    attempts = warm_store.attempts(drill.run_id)
    assert {a["job_id"] for a in attempts} == {job_id}
    assert _requeued(job_id)
    # The requeued driver rebuilt policy 2 by replaying optimize 0 and 1, once, in its first stage.
    assert [a.get("replayed_updates") for a in attempts if a.get("replayed_updates")] == [2]
    for update, stages in entries.items():
        for stage in stages:
            outcomes = [a["outcome"] for a in warm_store.attempts(drill.run_id, update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)
    assert {m["update"] for m in warm_store.read_metrics(drill.run_id)} == set(range(LONG_UPDATES + 1))


def _requeued(job_id: str) -> bool:
    return "Restarts=1" in slurm("scontrol", "show", "job", job_id) or "REQUEUE" in slurm(
        "sacct", "-j", job_id, "-n", "-X", "-D", "-o", "State"
    )


UPLOAD = "3:checkpoint.upload:started"
"""Checkpoint 3's upload, beside update 3, held before its first byte (probepo/stages/uploads.py)."""


def _short_grace_profile(profile_path: Path, tmp_path: Path) -> Path:
    """The drill profile with an 8 s signal grace: a held upload is given up 3 s after the stop."""
    profile = yaml.safe_load(profile_path.read_text())
    profile["defaults"]["signal_grace_s"] = 8
    path = tmp_path / "short-grace.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def _optimize_2_committed(store, run_id: str) -> None:
    """Wait until update 2's optimize is committed (the driver goes on while checkpoint 3 uploads)."""
    deadline = time.monotonic() + 60
    while store.marker(run_id, 2, "optimize") is None:
        assert time.monotonic() < deadline, "optimize 2 was not committed while checkpoint 3 was in flight"
        time.sleep(0.1)
    assert store.marker(run_id, 3, "checkpoint") is None  # its checkpoint in flight, not visible


def _checkpoint_3_never_seen(store, run_id: str) -> None:
    """No marker and no object of checkpoint 3: the run resumed by replaying policy 3 from checkpoint 0."""
    assert store.marker(run_id, 3, "checkpoint") is None
    assert not list(store.objects.list(f"{RunLayout(run_id).root}checkpoints/000003/"))
    assert [u for u, stages in store.ledger_entries(run_id).items() if "checkpoint" in stages] == [0, 5]
    # one stage rebuilt the policy from checkpoint 0: policy 3, or policy 4 where the driver had trained
    # update 3 too before the stop or kill found it (optimize 4 waits for checkpoint 3: it gets no further)
    attempts = store.attempts(run_id)
    replays = [(a["update"], a["replayed_updates"]) for a in attempts if a.get("replayed_updates")]
    assert len(replays) == 1 and replays[0][0] == replays[0][1] in (3, 4), replays
    assert store.verify(run_id).problems == []


def test_a_driver_preempted_while_a_checkpoint_uploads_abandons_it_and_resumes_bitwise(
    warm_store, tmp_path, profile_path, every_update_reference
):
    profile = _short_grace_profile(profile_path, tmp_path)
    drill = Drill(warm_store, "upload-preempted", tmp_path, profile, every_config(3), executor="resident")
    drill.pause = (UPLOAD,)
    drill.train()
    drill.paused_at(UPLOAD)
    _optimize_2_committed(warm_store, drill.run_id)
    preempt_with_a_high_job()  # the held upload cannot land within the grace: abandoned, the job requeued
    drill.finish()
    final = warm_store.read_stage(drill.run_id, LONG_UPDATES, "checkpoint")
    assert {name: final[name] for name in FINAL_FILES} == every_update_reference
    _checkpoint_3_never_seen(warm_store, drill.run_id)
    jobs = warm_store.jobs(drill.run_id, 0, "driver")
    assert len(jobs) == 1 and _requeued(jobs[0]["job_id"])  # the job requeued itself, never submitted again


def test_a_driver_killed_while_a_checkpoint_uploads_is_resubmitted_and_resumes_bitwise(
    warm_store, tmp_path, profile_path, every_update_reference
):
    drill = Drill(warm_store, "upload-killed", tmp_path, profile_path, every_config(3), executor="resident")
    drill.pause = (UPLOAD,)
    drill.train()
    driver = drill.paused_at(UPLOAD)
    _optimize_2_committed(warm_store, drill.run_id)
    os.kill(driver, signal.SIGKILL)  # the driver job's process, killed outright while its upload is held
    drill.finish()
    final = warm_store.read_stage(drill.run_id, LONG_UPDATES, "checkpoint")
    assert {name: final[name] for name in FINAL_FILES} == every_update_reference
    _checkpoint_3_never_seen(warm_store, drill.run_id)
    assert len(warm_store.jobs(drill.run_id, 0, "driver")) == 2  # the dead job's run submitted again

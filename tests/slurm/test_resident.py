"""The resident executor on the real SLURM cluster: the driver itself is one job that runs every stage with
its engines resident, so a run may checkpoint in full every 3 updates only. Preempted between two full
checkpoints (policy 2 exists only in the job's memory), the job commits at the next stage boundary and
requeues itself; run again, its driver replays optimize 0 and 1 from the store and goes on. The process
that submitted it is killed meanwhile, and `probepo resume --executor resident` re-attaches to the same job
instead of submitting a second. The final checkpoint is bitwise the inline checkpoint-every-update run's.
"""

from __future__ import annotations

import pytest

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
    assert "Restarts=1" in slurm("scontrol", "show", "job", job_id) or "REQUEUE" in slurm(
        "sacct", "-j", job_id, "-n", "-X", "-D", "-o", "State"
    )
    # The requeued driver rebuilt policy 2 by replaying optimize 0 and 1, once, in its first stage.
    assert [a.get("replayed_updates") for a in attempts if a.get("replayed_updates")] == [2]
    for update, stages in entries.items():
        for stage in stages:
            outcomes = [a["outcome"] for a in warm_store.attempts(drill.run_id, update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)
    assert {m["update"] for m in warm_store.read_metrics(drill.run_id)} == set(range(LONG_UPDATES + 1))

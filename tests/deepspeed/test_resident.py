"""The resident executor on two ranks: the driver is one SLURM job of two tasks, every rank runs every
stage in lockstep (rank 0 records and commits), the trainer is DeepSpeed ZeRO-2 sharded over both, and
policy 1 is never committed in full (checkpoint_every 2). The job is killed by SIGKILL after update 1's
select; the job submitted again rebuilds policy 1 on both ranks by replaying optimize 0 from checkpoint 0
and the committed batch (generating nothing again), and ends with the bits of an uninterrupted replay.
The node's scratch holds at most two copies of the policy's tensors at any time (a saved state leaves it
once committed). (The tiny model earns no reward here, so the gradients are 0: test_engine.py checks them.)"""

from __future__ import annotations

import pytest

from probepo.config import ExecutionProfile, StageResources
from probepo.run.faults import CRASH_ENV
from probepo.run.pipeline import train
from probepo.store import open_store
from slurm import make_runner
from tests.deepspeed.ranks_job import replay_on_two_local_ranks
from tests.hf.tiny_qwen import qwen_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_a_two_rank_driver_job_killed_between_checkpoints_replays_on_both_ranks(
    tiny_qwen, slurm_cluster, tmp_path, monkeypatch, scratch_of_killed_runs
):
    scratch_of_killed_runs("lockstep")
    store = open_store(tmp_path / "store")
    model = {"kind": "hf", "pretrained": str(tiny_qwen.folder), "trainer": "deepspeed", "zero_stage": 2}
    config = qwen_config(tiny_qwen.folder, model=model, checkpoint_every=2, eval={"problems": 2, "every": 2})
    driver = StageResources(partition="low", tasks_per_node=2, time_min=15)
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"), poll_s=0.3, poll_max_s=0.3, stages={"driver": driver}
    )
    monkeypatch.setenv(CRASH_ENV, "1:select:after-commit")  # both ranks kill themselves there
    train(config, "lockstep", store=store, runner=make_runner("resident", profile))

    jobs = store.jobs("lockstep", 0, "driver")
    assert [job["outcome"] for job in jobs] == ["died", "committed"]
    assert [u for u, stages in store.ledger_entries("lockstep").items() if "checkpoint" in stages] == [0, 2]
    replays = [a for a in store.attempts("lockstep") if a.get("replayed_updates")]
    assert [(a["update"], a["stage"], a["replayed_updates"]) for a in replays] == [(1, "probe", 1)]
    assert not any("replay_diverged" in a for a in store.attempts("lockstep"))
    for update, stages in store.ledger_entries("lockstep").items():
        for stage in stages:
            outcomes = [a["outcome"] for a in store.attempts("lockstep", update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)
    files = store.marker("lockstep", 2, "checkpoint")["files"]
    assert {f"optimizer-rank-0000{r}-of-00002.safetensors" for r in (0, 1)} <= set(files)
    # the node's scratch (both ranks' folder): at most 2 × (weights + the node's optimizer shards) + the rest
    tensors = sum(f["size"] for name, f in files.items() if name.endswith(".safetensors"))
    small = sum(f["size"] for f in files.values()) - tensors
    peak = max(
        m.get(key, 0) for m in store.read_metrics("lockstep") for key in m if key.endswith("/scratch_peak")
    )
    assert tensors <= peak <= 2 * tensors + small, (peak, tensors, small)

    monkeypatch.delenv(CRASH_ENV)
    assert replay_on_two_local_ranks(store.url, "lockstep", config.model_dump_json(), tmp_path, 1) == [
        True,
        True,
    ]

"""Jobs over two nodes of the test cluster (two slurmd on this machine, partition `wide`): the tiny Qwen2
recipe trained with DeepSpeed ZeRO-2 on 4 ranks, as 2 nodes x 2 ranks, ends with the same bits as on one
node x 4 ranks, through a fault on each path:

- the resident driver (every stage in one job of 2 x 2 ranks): node 2 set DOWN while the job runs; SLURM
  requeues the job, which resumes from the store once the node is back;
- a job per stage, optimize on 2 x 2 ranks: every rank is told to stop after the first mini-batch and
  commits its shard of the part, then node 2's ranks SIGKILL themselves (the grace window ran out there);
  the job ends, and its next run resumes at the next mini-batch from the 4 ranks' shards.

Both nodes share /tmp and 127.0.0.1 here, which would hide a shared-scratch or localhost assumption: each
node's ranks work in a scratch folder keyed by the node's name (the job logs say which), the ranks meet at
the address of the job's first node, and the optimizer shards of node 2's ranks reach the store from node
2's own folder. (The tiny model earns no reward, so its advantages are 0 and AdamW's weight decay is all an
update changes: the bits compared are each rank's fp32 master partition, moments and step count restored
from its own shard; test_engine.py checks the sharded gradients on a batch with non-zero advantages.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.run.faults import CRASH_ENV, STOP_ENV
from probepo.run.pipeline import train
from probepo.store import ArtifactStore, open_store
from slurm import make_runner
from tests.hf.tiny_qwen import qwen_config
from tests.slurm.drill import Drill, accounted_states, slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NODES = ("probepo-node1", "probepo-node2")
AFTER_FIRST_MINIBATCH = "0:optimize.minibatch-0000:done"
"""The first of the update's two mini-batches stepped: where a stop commits the 4 ranks' shards of a part."""
PART_COMMITTED = "0:optimize.part-0000:after-commit"


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster) -> None:
    partitions = slurm("sinfo", "-h", "-o", "%R %D").split()
    if "wide" not in partitions or partitions[partitions.index("wide") + 1] != "2":
        pytest.skip("the SLURM test cluster has one node: start it with PROBEPO_SLURM_NODES=2 (.ci/run does)")


@pytest.fixture(scope="module")
def one_node(two_nodes, tiny_qwen, tmp_path_factory) -> dict[str, bytes]:
    """The final checkpoint of the recipe on one node x 4 ranks, the reference of both tests: one resident job
    (every executor commits the same bits, tests/slurm/test_executors.py; the 4 ranks, not the executor, fix
    them here)."""
    folder = tmp_path_factory.mktemp("one-node")
    store = open_store(folder / "store")
    runner = make_runner("resident", profile(folder / "jobs", driver=ranks("low", 1)))
    train(recipe(tiny_qwen.folder), "one-node", store=store, runner=runner)
    return final_checkpoint(store, "one-node")


def recipe(model_folder: Path) -> RunConfig:
    model = {"kind": "hf", "pretrained": str(model_folder), "trainer": "deepspeed", "zero_stage": 2}
    return qwen_config(model_folder, num_updates=1, model=model, eval={"problems": 2, "every": 1})


def ranks(partition: str, nodes: int) -> StageResources:
    return StageResources(partition=partition, nodes=nodes, tasks_per_node=4 // nodes, time_min=15)


def profile(folder: Path, **stages: StageResources) -> ExecutionProfile:
    one_rank = StageResources(partition="wide", time_min=15, signal_grace_s=30)
    return ExecutionProfile(
        job_folder=str(folder), poll_s=0.3, poll_max_s=0.3, defaults=one_rank, stages=stages
    )


def final_checkpoint(store: ArtifactStore, run_id: str) -> dict[str, bytes]:
    files = store.read_stage(run_id, 1, "checkpoint")
    return {name: files[name] for name in files.marker["files"]}


def assert_committed_once(store: ArtifactStore, run_id: str) -> None:
    for update, stages in store.ledger_entries(run_id).items():
        for stage in stages:
            outcomes = [a["outcome"] for a in store.attempts(run_id, update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)


RANK_LINE = re.compile(
    r"probepo: rank (\d) of 4 \(local rank \d\) on node (\S+); rendezvous (\S+), the address of (\S+), the"
    r" first of the job's 2 node\(s\) (\S+)"
)
SCRATCH_LINE = re.compile(r"probepo: rank (\d): scratch (\S+) of node (\S+)")


def assert_four_ranks_over_two_nodes(job_folder: Path) -> None:
    """What the tasks' logs say: ranks 0-1 on node 1 and 2-3 on node 2, all meeting at the address of the
    first node of the job's node list (node 1's NodeAddr), each in a scratch folder keyed by its node."""
    said = "\n".join(path.read_text() for path in job_folder.rglob("*_log.out"))
    where = set(RANK_LINE.findall(said))
    assert {(int(rank), node) for rank, node, *_ in where} == {
        (0, NODES[0]),
        (1, NODES[0]),
        (2, NODES[1]),
        (3, NODES[1]),
    }
    meetings = {(address.rsplit(":", 1)[0], first, listed) for _, _, address, first, listed in where}
    assert meetings == {("127.0.0.1", NODES[0], ",".join(NODES))}
    scratch = {(int(rank), folder, node) for rank, folder, node in SCRATCH_LINE.findall(said)}
    assert {(rank, node) for rank, _, node in scratch} == {
        (0, NODES[0]),
        (1, NODES[0]),
        (2, NODES[1]),
        (3, NODES[1]),
    }
    assert all(folder.endswith(f"-{node}") for _, folder, node in scratch), scratch


def test_a_resident_driver_over_two_nodes_survives_a_node_set_down_and_equals_one_node(
    one_node, tiny_qwen, tmp_path, scratch_of_killed_runs
):
    config = recipe(tiny_qwen.folder)
    store = open_store(tmp_path / "store")
    scratch_of_killed_runs("two-nodes")
    path = tmp_path / "two-nodes.yaml"
    path.write_text(
        yaml.safe_dump(profile(tmp_path / "jobs", driver=ranks("wide", 2)).model_dump(mode="json"))
    )
    pause = (AFTER_FIRST_MINIBATCH,)
    drill = Drill(store, "two-nodes", tmp_path, path, config, pause=pause, executor="resident")
    drill.train()
    drill.paused_at(AFTER_FIRST_MINIBATCH)
    job = drill.job_id(0, "driver")
    drill.node_down_under(job, NODES[1])  # node 2 only: SLURM ends the whole job and requeues it
    drill.release.touch()  # the job's next run may start the optimizer over (no part): past the pause
    drill.finish()

    assert final_checkpoint(store, "two-nodes") == one_node
    assert {f"optimizer-rank-0000{r}-of-00004.safetensors" for r in range(4)} <= set(
        final_checkpoint(store, "two-nodes")
    )
    assert_committed_once(store, "two-nodes")
    states = accounted_states(job)
    assert states[0] == "NODE_FAIL" and states[-1] == "COMPLETED", states  # SLURM requeued it: one job id
    assert drill.submissions(0, "driver") == 1
    # a node lost is a hard death: the update reruns from what is committed. SLURM's kill sends SIGTERM
    # first, so the ranks may have committed a part in its KillWait; the resume starts right after it.
    parts = [s for s in store.committed_stages("two-nodes", 0) if s.startswith("optimize.part-")]
    resumed = store.attempts("two-nodes", 0, "optimize")[-1]
    assert resumed["outcome"] == "committed" and resumed["resumed_at_minibatch"] == len(parts) <= 1
    assert_four_ranks_over_two_nodes(tmp_path / "jobs")


def test_an_optimize_job_over_two_nodes_resumes_after_one_nodes_ranks_are_killed_and_equals_one_node(
    one_node, tiny_qwen, tmp_path, monkeypatch, scratch_of_killed_runs
):
    config = recipe(tiny_qwen.folder)
    store = open_store(tmp_path / "store")
    scratch_of_killed_runs("two-nodes")
    monkeypatch.setenv(STOP_ENV, AFTER_FIRST_MINIBATCH)  # every rank, as SLURM signals every task
    monkeypatch.setenv(CRASH_ENV, f"{PART_COMMITTED}@{NODES[1]}")  # then ranks 2 and 3 kill themselves
    # the trainer's stages (score and optimize) run on the same ranks: each loads its own shard
    two = profile(tmp_path / "jobs", score=ranks("wide", 2), optimize=ranks("wide", 2))
    train(config, "two-nodes", store=store, runner=make_runner("slurm", two))

    assert final_checkpoint(store, "two-nodes") == one_node
    assert_committed_once(store, "two-nodes")
    assert store.committed("two-nodes", 0, "optimize.part-0000")
    jobs = store.jobs("two-nodes", 0, "optimize")
    states = [accounted_states(job["job_id"])[-1] for job in jobs]
    assert jobs[-1]["outcome"] == "committed" and states[-1] == "COMPLETED", (jobs, states)
    # the job requeued itself (rank 0's Preempted) or failed with the dead ranks and was submitted again;
    # either way the stage resumed from the part, each rank loading its own shard on its own node
    attempts = store.attempts("two-nodes", 0, "optimize")
    assert attempts[-1]["outcome"] == "committed" and attempts[-1]["resumed_at_minibatch"] == 1
    assert_four_ranks_over_two_nodes(tmp_path / "jobs" / "two-nodes")

"""The ranks of a multi-node job: the rendezvous is the address of the job's first node (from
SLURM_JOB_NODELIST, as srun sets it), never this host's; each node's scratch folder is keyed by the node's
name and holds of a sharded optimizer only its own ranks' shards; a collective that failed because another
rank died is told apart from a rank's own error."""

from __future__ import annotations

import pytest

import slurm.ranks
from probepo.run import distributed


def test_rank_3_on_the_second_node_meets_the_others_at_the_first_nodes_address(monkeypatch):
    environment = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "gpu08",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    asked: list[str] = []
    monkeypatch.setattr(slurm.ranks, "address_of", lambda node: asked.append(node) or f"10.0.0.{node[-1]}")
    ranks = slurm.ranks.job_ranks()
    assert asked == ["gpu07"]
    assert (ranks.rank, ranks.local_rank, ranks.world_size, ranks.node) == (3, 1, 4, "gpu08")
    assert (ranks.master_addr, ranks.master_port, ranks.nodes) == ("10.0.0.7", 24242, ("gpu07", "gpu08"))
    assert (
        "rendezvous 10.0.0.7:24242, the address of gpu07, the first of the job's 2 node(s)"
        in ranks.describe()
    )
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", distributed.NODE_ENV):
        monkeypatch.setenv(name, "")  # so that what export sets is undone after the test
    ranks.export()
    assert distributed.node_name() == "gpu08" and not distributed.is_node_leader()


@pytest.mark.parametrize("node", ["node-a", "node-b"])
def test_each_node_has_its_own_scratch_folder(monkeypatch, tmp_path, node):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv(distributed.NODE_ENV, node)
    folder = distributed.node_scratch("probepo-run-job7")
    assert folder == tmp_path / f"probepo-run-job7-{node}" and folder.is_dir()


def test_a_node_fetches_the_optimizer_shards_of_its_own_ranks_only():
    from probepo.run.schedule import optimizer_shard_name
    from probepo.stages.committed import files_for_node

    shards = [
        f"{optimizer_shard_name(rank, 4)}{suffix}"
        for rank in range(4)
        for suffix in (".json", ".safetensors")
    ]
    names = ["config.json", "model.safetensors", "trainer.json", *shards]
    second_node = files_for_node(names, [2, 3], optimizer_state=True)
    assert second_node == [*names[:3], *shards[4:]]
    assert files_for_node(names, [2, 3], optimizer_state=False) == names[:3]
    assert files_for_node(["optimizer.safetensors", "model.safetensors"], [1], optimizer_state=True) == [
        "optimizer.safetensors",
        "model.safetensors",
    ]


def test_a_collective_that_lost_a_rank_is_told_from_a_ranks_own_error(monkeypatch):
    gone = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer"
        " [127.0.0.1]:22658. This is typically caused by a remote worker crashing."
    )
    own = [RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"), ValueError("x")]
    assert not distributed.lost_a_rank(gone)  # one process: no other rank to lose
    monkeypatch.setattr(distributed, "world_size", lambda: 4)
    assert distributed.lost_a_rank(gone) and not any(map(distributed.lost_a_rank, own))

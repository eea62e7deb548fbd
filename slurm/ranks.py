"""The rank environment of a multi-task job, as torch.distributed and DeepSpeed expect it (the ranks join
their process group through it: probepo.run.distributed). A job's ranks may span several nodes: they meet at
the job's first node (SLURM_JOB_NODELIST), and each knows its own node by name (SLURMD_NODENAME)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass

from probepo.run.distributed import NODE_ENV

PORT_BASE, PORT_SPAN = 20000, 12000
"""Rendezvous ports 20000-31999: below Linux's ephemeral range (32768 up by default), where the node's own
outgoing connections take ports; a rank 0 that drew one held by such a socket failed with EADDRINUSE and
left the other ranks waiting on the rendezvous (seen in CI: port 34206 of local job 14206)."""


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in its job."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    node: str
    """The node this rank runs on, by SLURM's name for it."""
    nodes: tuple[str, ...]
    """The job's nodes (from SLURM_JOB_NODELIST, in its order); the first one is the rendezvous."""

    def export(self) -> None:
        """Set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (`init_process_group(init_method=
        "env://")` and DeepSpeed read them) and the node's name (probepo.run.distributed.NODE_ENV)."""
        os.environ.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            **{NODE_ENV: self.node},
        )

    def describe(self) -> str:
        """One line for the job's log: where this rank is and where the ranks meet."""
        return (
            f"rank {self.rank} of {self.world_size} (local rank {self.local_rank}) on node {self.node};"
            f" rendezvous {self.master_addr}:{self.master_port}, the address of {self.nodes[0]}, the first of"
            f" the job's {len(self.nodes)} node(s) {','.join(self.nodes)}"
        )


def job_ranks() -> Ranks:
    """This task's ranks from submitit's view of the job (SLURM's SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS
    and SLURM_JOB_NODELIST, or the local executor's equivalents). The job's first node is the rendezvous
    (SLURM starts rank 0 there); the port derives from the job id, so that jobs sharing a node do not
    collide and a requeued job finds the same one."""
    import submitit

    env = submitit.JobEnvironment()
    digits = "".join(ch for ch in str(env.job_id) if ch.isdigit()) or "0"
    nodes = tuple(env.hostnames)
    return Ranks(
        rank=env.global_rank,
        local_rank=env.local_rank,
        world_size=env.num_tasks,
        master_addr=address_of(nodes[0]),
        master_port=PORT_BASE + int(digits) % PORT_SPAN,
        node=os.environ.get("SLURMD_NODENAME") or env.hostname,
        nodes=nodes,
    )


def address_of(node: str) -> str:
    """An address other ranks can reach `node` at: its DNS name where it resolves (real clusters), else the
    NodeAddr SLURM knows it by (a node name that is only SLURM's, as on the test cluster)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    shown = subprocess.run(
        ["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30
    )
    found = re.search(r"\bNodeAddr=(\S+)", shown.stdout)
    return found.group(1) if found else node

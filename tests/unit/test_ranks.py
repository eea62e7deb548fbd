"""slurm.ranks: the rendezvous port a job's ranks derive from its job id."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit

from slurm.ranks import PORT_BASE, PORT_SPAN, job_ranks


def _ephemeral_start() -> int:
    """The first port Linux hands out for outgoing connections (32768 when it cannot be read)."""
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    return int(path.read_text().split()[0]) if path.exists() else 32768


@pytest.mark.parametrize("job_id", ["1", "14206", "32767", "987654321", "5550123_7", "19999"])
def test_the_rendezvous_port_is_below_the_ephemeral_range_and_stable_per_job(job_id, monkeypatch):
    view = SimpleNamespace(
        job_id=job_id,
        global_rank=1,
        local_rank=1,
        num_tasks=2,
        num_nodes=1,
        hostnames=["localhost"],
        hostname="localhost",
    )
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: view)
    first, again = job_ranks(), job_ranks()
    assert PORT_BASE <= first.master_port < PORT_BASE + PORT_SPAN <= _ephemeral_start()
    assert first.master_port == again.master_port  # a requeued job finds the same port
    assert (first.rank, first.local_rank, first.world_size) == (1, 1, 2)

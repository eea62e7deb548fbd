"""Whether the driver job holding a run's lease has ended, as SLURM's accounting says: the look-up that
probepo's lease takeover is handed (probepo.store.lease.HolderEnded; probepo never imports slurm/). A
driver job killed outright (out of memory, its node failed, scancel) leaves its lease behind, and a job
of another node cannot judge it by pid: without this the next driver waits for the lease to expire.

Job ids are the cluster's own: drivers of one store run on one cluster.
"""

from __future__ import annotations

import subprocess
from typing import Any

from probepo.run.driver_lease import holder_job_id
from slurm.accounting import job_states


def holder_ended(lease: dict[str, Any]) -> bool | None:
    """True if the lease's holder is a SLURM job that has ended (COMPLETED, FAILED, CANCELLED, TIMEOUT,
    OUT_OF_MEMORY, NODE_FAIL... with nothing of it left in the queue), False while it may still run
    (pending, running, requeued), None if the holder is no job or SLURM cannot say (no sacct here, no
    answer, a job it does not know)."""
    job_id = holder_job_id(lease)
    if job_id is None:
        return None
    try:
        info = job_states([job_id])[job_id]
    except (OSError, subprocess.SubprocessError):  # no SLURM commands here, or they did not answer
        return None
    if info.state == "UNKNOWN":
        return None
    return not info.alive

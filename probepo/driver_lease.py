"""The run's lease as a driver holds it: who the driver is (a SLURM job keeps its lease across a requeue),
taking the lease (over a holder known to have ended), and keeping it renewed from a background thread
while the stages run. The lease itself, a compare-and-swap record in the store: probepo/store/lease.py."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from probepo.store import ArtifactStore, Lease, LeaseLost, StoreError, acquire_lease
from probepo.store.lease import HolderEnded
from probepo.store.lease import take_lease as store_take_lease

LEASE_TTL_S = 600.0
SLURM_HOLDER = "slurm-job-"
"""How a driver running as a SLURM job names itself as the lease's holder: this, then its job id."""
log = logging.getLogger(__name__)


def driver_id() -> str:
    """Who drives the run: the SLURM job (a requeued job keeps its id, so it keeps its lease) or host:pid."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"{SLURM_HOLDER}{job}" if job else f"{socket.gethostname()}:{os.getpid()}"


def holder_job_id(lease: dict[str, Any]) -> str | None:
    """The SLURM job id of a lease's holder when a driver job holds it (driver_id), else None."""
    holder = str(lease.get("holder", ""))
    job = holder.removeprefix(SLURM_HOLDER)
    return job if holder.startswith(SLURM_HOLDER) and job.isdigit() else None


class LeaseKeeper:
    """Renews a lease from a background thread every quarter of its TTL, so that a stage longer than the
    TTL (a long probe on a big model) never lets the lease lapse. The driver calls `check()` between
    stages: it raises LeaseLost once someone else has taken the run over."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{lease.run_id}", daemon=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease.record["ttl_s"] / 4):
            try:
                self.lease.renew()
            except LeaseLost as exc:
                self.lost = exc
                return
            except StoreError as exc:  # transient: the next beat retries well before the expiry
                log.warning("renewing the lease of run %s failed: %s", self.lease.run_id, exc)

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.lease.release()


def take_lease(
    store: ArtifactStore, run_id: str, *, force: bool = False, holder_ended: HolderEnded | None = None
) -> Lease:
    """The run's lease for this driver; a lease left by a dead process of this host, or by a holder that
    `holder_ended` says ended, is taken over, and with `force` any lease (the holder must be known dead: a
    live one loses it at its next renewal)."""
    if force:
        return acquire_lease(store, run_id, driver_id(), LEASE_TTL_S, force=True)
    return store_take_lease(store, run_id, driver_id(), LEASE_TTL_S, ended=holder_ended)

"""The run's lease as a driver holds it: who the driver is (a SLURM job keeps its lease across a requeue),
taking the lease (over a holder known to have ended), and keeping it renewed from a background thread
while the stages run, its promise kept through a store outage. The lease itself, a compare-and-swap record
in the store: probepo/store/lease.py."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import replace
from typing import Any

from probepo.store import ArtifactStore, Lease, LeaseLost, StoreError, acquire_lease
from probepo.store.keys import RunLayout
from probepo.store.lease import HolderEnded
from probepo.store.lease import take_lease as store_take_lease
from probepo.store.outage import BACKOFF_CAP_S, RIDER, WriteFence

LEASE_TTL_S = 600.0
FENCE_MARGIN = 0.25
"""The share of the TTL by which a holder that cannot renew stops writing before its lease could expire:
room for the clock skew between hosts and for a write already on its way."""
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
    stages: it raises LeaseLost once someone else has taken the run over.

    Through a store outage the holder keeps its promise: its store's writes of the run are fenced
    (outage.WriteFence)
    FENCE_MARGIN of the TTL before the lease could expire unrenewed (`Lease.certain_until`). A holder that
    cannot renew says so, and its next write (the commit of its next safe point) waits at the fence for a
    renewal, riding out the outage; once a renewal finds the lease taken over, every write of the run
    raises LeaseLost. So nothing is committed after another driver may have taken the run over. A
    renewal tried again after an outage is still conditional on the lease's version: it succeeds only if
    nobody took the lease meanwhile."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{lease.run_id}", daemon=True)
        layout = RunLayout(lease.run_id)
        holder = f"run {lease.run_id}'s driver {lease.holder}"
        self._fence = WriteFence(layout.root, layout.lease, 0.0, holder)
        self._objects = lease.store.objects

    def _fenced_at(self) -> float:
        return self.lease.certain_until - FENCE_MARGIN * self.lease.record["ttl_s"]

    def _renew(self) -> None:
        beat = self.lease.record["ttl_s"] / 4
        failing = False
        with RIDER.background(self._stop):  # its waits end with the keeper, and are no stage's
            while not self._stop.wait(min(beat, BACKOFF_CAP_S) if failing else beat):
                try:
                    with RIDER.capped(self._fenced_at()):  # the fence says it then, and retries go on
                        self.lease.renew()
                except LeaseLost as exc:
                    self.lost = exc
                    self._objects.fence = replace(self._fence, lost=exc)
                    log.warning("%s; this driver writes nothing more of the run", exc)
                    return
                except StoreError as exc:
                    if not failing:
                        self._say_unrenewed(exc)
                    failing = True
                    continue
                failing = False
                self._fence = replace(self._fence, until=self._fenced_at())
                self._objects.fence = self._fence

    def _say_unrenewed(self, exc: StoreError) -> None:
        """A renewal failed (at the fence, or at once where the process does not ride out outages): say
        until when the lease is surely ours, and that the run's writes wait from then on."""
        certain = time.time() + self.lease.certain_until - time.monotonic()
        log.warning(
            "run %s: could not renew the lease (%s); it is ours until %s at least: this driver writes nothing"
            " of the run past %g s before that (it stops at its next commit) until a renewal goes through",
            self.lease.run_id,
            exc,
            time.strftime("%H:%M:%S", time.localtime(certain)),
            FENCE_MARGIN * self.lease.record["ttl_s"],
        )

    def check(self) -> None:
        if self.lost is not None:
            raise self.lost

    def __enter__(self) -> LeaseKeeper:
        self._fence = replace(self._fence, until=self._fenced_at())
        self._objects.fence = self._fence
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._objects.fence = None
        try:
            self.lease.release()
        except StoreError as exc:
            if kind is None:
                raise
            # the run already fails: its own error says more; the lease expires, or is taken over at once
            # by a driver that knows this one ended (a dead process, a SLURM job accounting shows ended)
            log.warning("run %s: could not release the lease: %s", self.lease.run_id, exc)


def take_lease(
    store: ArtifactStore, run_id: str, *, force: bool = False, holder_ended: HolderEnded | None = None
) -> Lease:
    """The run's lease for this driver; a lease left by a dead process of this host, or by a holder that
    `holder_ended` says ended, is taken over, and with `force` any lease (the holder must be known dead: a
    live one loses it at its next renewal)."""
    if force:
        return acquire_lease(store, run_id, driver_id(), LEASE_TTL_S, force=True)
    return store_take_lease(store, run_id, driver_id(), LEASE_TTL_S, ended=holder_ended)

"""The run lease: one driver works on a run at a time.

`lease.json` holds the holder, its host and pid, and an expiry. It is created with a create-only write and
renewed, taken over or released with compare-and-swap on its version (S3 ETag with `If-Match`; locally the
content hash under an fcntl lock); where DELETE ignores If-Match (Ceph RGW 16), a release is a
compare-and-swap write of a released record, read as no lease. An expired lease may be taken over, and so
may one whose holder is known to be gone: a process of this host that no longer exists, or a holder that a
scheduler's accounting says ended (a HolderEnded look-up, handed in by whoever knows the scheduler: probepo
never imports slurm/). A live one raises LeaseHeld naming the holder. Expiry compares wall clocks across
hosts: keep the TTL well above the clock skew (minutes). Through a store outage the holder keeps its
promise by its own clock: `Lease.certain_until` says until when no other driver can have taken it over
(driver_lease.LeaseKeeper fences the run's writes past it: probepo/store/outage.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

from probepo.store.errors import FormatError, LeaseHeld, LeaseLost, StoreError
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import RunLayout, utc_now

if TYPE_CHECKING:
    from probepo.store.store import ArtifactStore

ACQUIRE_RACES = 8
log = logging.getLogger("probepo.store")

HolderEnded = Callable[[dict[str, Any]], bool | None]
"""Judges a lease record's holder from outside this host (a scheduler's accounting): True, it ended;
False, it is alive (pending, running, requeued); None, it cannot tell (not a holder it knows, no
answer). The SLURM executors hand in slurm.holders.holder_ended."""


def _lease_record(holder: str, ttl_s: float, token: str, acquired_at: str) -> dict[str, Any]:
    now = time.time()
    return {
        "holder": holder,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "token": token,
        "ttl_s": ttl_s,
        "acquired_at": acquired_at,
        "renewed_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "expires_at": datetime.fromtimestamp(now + ttl_s, UTC).isoformat(timespec="seconds"),
        "expires_at_epoch": now + ttl_s,
    }


def _released_record(holder: str) -> dict[str, Any]:
    """What a release writes where the endpoint has no conditional DELETE: read as no lease at all."""
    return {"released": True, "released_by": holder, "released_at": utc_now(), "expires_at_epoch": 0}


def _released(record: Any) -> bool:
    return isinstance(record, dict) and record.get("released") is True


def _expired(record: dict[str, Any]) -> bool:
    expiry = record.get("expires_at_epoch")
    return not isinstance(expiry, int | float) or expiry <= time.time()


class Lease:
    """A held lease; renew it well within its TTL, release it when done (or use it as a context manager)."""

    def __init__(
        self,
        store: ArtifactStore,
        run_id: str,
        record: dict[str, Any],
        etag: str,
        replaced: dict[str, Any] | None = None,
        *,
        written_at: float,
    ) -> None:
        self.store, self.run_id, self.record, self._etag = store, run_id, record, etag
        self.replaced = replaced
        """The lease record this one overwrote (expired, ours, taken over or forced), or None."""
        self.written_at = written_at
        """When (time.monotonic) the write that set the current expiry was made, before it was sent."""
        self._key = RunLayout(run_id).lease
        self.released = False

    @property
    def holder(self) -> str:
        return self.record["holder"]

    @property
    def expires_at(self) -> float:
        """Expiry as epoch seconds."""
        return self.record["expires_at_epoch"]

    @property
    def certain_until(self) -> float:
        """Until when (time.monotonic) the lease is surely ours by this process's clock: its TTL from
        before the write that set its expiry. Another driver may take it over only after that."""
        return self.written_at + self.record["ttl_s"]

    def renew(self) -> None:
        """Push the expiry out by the TTL; raises LeaseLost if someone else took the lease meanwhile."""
        written_at = time.monotonic()
        record = _lease_record(
            self.holder, self.record["ttl_s"], self.record["token"], self.record["acquired_at"]
        )
        data = to_json_bytes(record)
        etag = self.store.objects.put_if_match(self._key, data, self._etag)
        if etag is None:
            raise LeaseLost(
                f"lost the lease of run {self.run_id!r} (held by {self.holder!r}): it expired and was taken "
                "over, or was forced; stop working on this run"
            )
        self.record, self._etag, self.written_at = record, etag, written_at

    def release(self) -> None:
        """Give the lease up (a no-op if it was already lost)."""
        if not self.released:
            objects = self.store.objects
            if objects.honours_conditional_delete():
                objects.delete_if_match(self._key, self._etag)
            else:  # a compare-and-swap write replaces only our own version, as the conditional delete would
                objects.put_if_match(self._key, to_json_bytes(_released_record(self.holder)), self._etag)
            self.released = True

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def read_lease(store: ArtifactStore, run_id: str) -> dict[str, Any] | None:
    """The current lease record of a run (expired or not), or None (none, or released)."""
    current = store.objects.get_versioned(RunLayout(run_id).lease)
    if current is None:
        return None
    try:
        record = from_json_bytes(current.data)
    except FormatError:
        return {"holder": "<unreadable lease.json>"}
    return None if _released(record) else record


def holder_is_dead(lease: dict[str, Any], ended: HolderEnded | None = None) -> bool:
    """Whether a lease's holder is gone: a process of this host that no longer exists (killed, crashed),
    or a holder that `ended` says ended (a SLURM job that accounting shows failed, cancelled, out of
    memory...). A holder on another host that nothing judges is never dead from here: its expiry is the
    only evidence."""
    if lease.get("host") == socket.gethostname() and isinstance(lease.get("pid"), int):
        try:
            os.kill(lease["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            pass
    # a live pid may be a reused one: a holder whose job the scheduler says ended is gone all the same
    return ended is not None and ended(lease) is True


def acquire_lease(
    store: ArtifactStore,
    run_id: str,
    holder: str,
    ttl_s: float,
    *,
    force: bool = False,
    take_over: Callable[[dict[str, Any]], bool] | None = None,
) -> Lease:
    """Take the run's lease for `ttl_s` seconds.

    Succeeds if there is no lease, it expired, it is ours (same holder), `take_over(lease)` says so, or
    `force`; otherwise raises LeaseHeld naming the holder, its host and the expiry. Each write is
    conditional on the version just judged: when a racing driver takes the lease first, the next round
    judges that driver's lease, so a takeover of a dead holder never overwrites a live one (only `force`,
    an operator's decision, overwrites whatever is current).
    """
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    key = RunLayout(run_id).lease
    objects = store.objects
    written_at = time.monotonic()
    record = _lease_record(holder, ttl_s, uuid.uuid4().hex, datetime.now(UTC).isoformat(timespec="seconds"))
    data = to_json_bytes(record)
    for _ in range(ACQUIRE_RACES):
        current = objects.get_versioned(key)
        existing: dict[str, Any] | None = None
        if current is None:
            etag = objects.put_if_absent(key, data)
        else:
            try:
                existing = from_json_bytes(current.data)
            except FormatError:
                existing = {}  # unreadable: treat as expired, it protects nothing
            if _released(existing):
                existing = None  # released, it replaces nothing
            free = existing is None or _expired(existing) or existing.get("holder") == holder
            if not (force or free or (take_over is not None and take_over(existing))):
                raise LeaseHeld(run_id, existing)
            etag = objects.put_if_match(key, data, current.etag)
        if etag is not None:
            return Lease(store, run_id, record, etag, replaced=existing, written_at=written_at)
    raise StoreError(f"could not take the lease of run {run_id!r}: lost {ACQUIRE_RACES} races in a row")


def take_lease(
    store: ArtifactStore, run_id: str, holder: str, ttl_s: float, *, ended: HolderEnded | None = None
) -> Lease:
    """The lease for a command that works on a run (a driver, gc): free, expired or ours, or left by a
    holder that is gone (holder_is_dead, with `ended` judging holders of other hosts), which is taken over
    at once (logged); a live holder raises LeaseHeld."""
    lease = acquire_lease(store, run_id, holder, ttl_s, take_over=partial(holder_is_dead, ended=ended))
    old = lease.replaced
    if old is not None and old.get("holder") != holder and not _expired(old):
        log.warning(
            "run %s: took over the lease of %s on %s (it is gone: its process, or its job per the scheduler)",
            run_id,
            old.get("holder"),
            old.get("host"),
        )
    return lease

"""Riding out store outages: an S3 endpoint that stops answering for minutes (a gateway restarted for
maintenance, a network blip) costs minutes, not the run.

Every operation of the S3 backend goes through `RIDER.ride_out` (s3.py). When it fails with StoreOutage
(connection refused or reset, a timeout, 5xx after botocore's own retries: s3_errors.py) it is tried again
after 1, 2, 4 … up to 30 s, until the outage has lasted the process's patience (the profile's
`store_outage_s`) or, in a job, until the job's time limit less its signal grace, whichever comes first;
then the last StoreOutage is raised, its message saying since when and why it gave up. Nothing is
recomputed: the operation itself is tried again. The outage is the process's: it begins at the first
failure of any operation and ends at the first success, said once as it begins, once a minute while it
lasts and once as it ends. The seconds an attempt's threads spent waiting (once however many waited at the
same time) go to its spend counters as `store_wait`.

The patience is a process-wide setting (`RIDER.configured`), set by whoever knows the profile and the job's
time limit: the job entry of slurm/job.py (handed an `OutageBudget` by the runner that submitted it), the
CLI's train and resume, the train flow. Unset (a library call, `probepo store ls`) it is 0: the first
unanswered request fails as it always did.

A driver that holds a run's lease fences its store's writes of the run (`WriteFence`, set on the object
store by driver_lease.LeaseKeeper): past the moment its lease could have expired unrenewed, no write of
the run goes out until the lease is renewed (a write waits there as in an outage), and once the lease is
known lost every such write raises LeaseLost. The lease's own writes, conditional on its version, are
never fenced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from probepo import spend
from probepo.store.errors import LeaseLost, StoreOutage

STORE_UNREACHABLE_EXIT = 69
"""Exit status of a job that gave up on an unreachable store (EX_UNAVAILABLE): its runner submits it
again like any death, naming the store as the cause."""
BACKOFF_START_S = 1.0
BACKOFF_CAP_S = 30.0
SAY_EVERY_S = 60.0
"""While an outage lasts, it is said again this often (and a waiting process's `carry_on` no more often)."""

T = TypeVar("T")
log = logging.getLogger("probepo.store")


@dataclass(frozen=True)
class OutageBudget:
    """How long a process waits for an unreachable store: what a runner hands the job it submits."""

    patience_s: float
    """The profile's store_outage_s."""
    time_left_s: float | None = None
    """Seconds from `configured` to the moment no wait may pass (a job's time limit less its signal grace);
    None: no such moment."""


@dataclass(frozen=True)
class WriteFence:
    """A lease holder's promise: no write under `prefix` (the run's folder) after `until` (the rider's
    monotonic clock), but to `exempt` (the lease itself), until the lease is renewed; none at all once
    `lost`."""

    prefix: str
    exempt: str
    until: float
    holder: str
    """Who holds the lease, for messages: e.g. `run r's driver slurm-job-12`."""
    lost: LeaseLost | None = None


class Clock:
    """The rider's time; tests hand in a fake one whose sleeps only move it on."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float, interrupt: threading.Event | None) -> bool:
        """Sleep `seconds`; returns True if `interrupt` was set meanwhile (the sleep then ends at once)."""
        if interrupt is None:
            time.sleep(seconds)
            return False
        return interrupt.wait(seconds)


@dataclass(frozen=True)
class _Wait:
    """One operation's wait: since when the outage it met lasts, its deadline, whether it is counted."""

    since: float
    since_wall: float
    deadline: float
    counted: bool


def _when(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")


class Rider:
    """Rides out the store outages of this process (see the module's docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.patience_s = 0.0
        self.ends_at: float | None = None
        self._lock = threading.Lock()
        self._since: tuple[float, float] | None = None
        """When the outage on now began (monotonic, wall); None while the store answers."""
        self._said_at = 0.0
        self._carried_at: float | None = None
        self._waiters = 0
        self._waiting_since = 0.0
        self._thread = threading.local()

    @property
    def riding(self) -> bool:
        """Whether this process waits for an unreachable store at all."""
        return self.patience_s > 0

    @contextmanager
    def configured(self, budget: OutageBudget) -> Iterator[None]:
        """Within it, this process's patience and the moment past which no wait goes (counted from now);
        the settings before come back after (a command run in a test's process leaves none behind)."""
        before = self.patience_s, self.ends_at
        self.patience_s = budget.patience_s
        self.ends_at = None if budget.time_left_s is None else self.clock.monotonic() + budget.time_left_s
        try:
            yield
        finally:
            self.patience_s, self.ends_at = before

    def ride_out(
        self,
        operation: Callable[[], T],
        *,
        key: str = "",
        fence: Callable[[], WriteFence | None] | None = None,
    ) -> T:
        """`operation()`, tried again while it raises StoreOutage until the deadline (then that error is
        raised, saying since when and why the wait ended). `fence`: the operation writes `key`, which the
        fence it returns (read before each try: a renewal moves it) may hold back."""
        wait: _Wait | None = None
        pause = BACKOFF_START_S
        try:
            while True:
                try:
                    if fence is not None:
                        self._check_fence(fence(), key)
                    result = operation()
                except StoreOutage as exc:
                    now = self.clock.monotonic()
                    if wait is None:
                        wait = self._began(exc, now)
                    else:
                        self._still(exc, now)
                    if now >= wait.deadline:
                        if not self.riding:
                            raise
                        raise self._gave_up(exc, wait, now) from None
                    if self.clock.sleep(min(pause, wait.deadline - now), self._interrupt()):
                        raise self._gave_up(exc, wait, self.clock.monotonic(), "its thread stops") from None
                    pause = min(2 * pause, BACKOFF_CAP_S)
                else:
                    self._answered()
                    return result
        finally:
            if wait is not None and wait.counted:
                self._stop_waiting()

    def _began(self, exc: StoreOutage, now: float) -> _Wait:
        """An operation's first failure: the process's outage begins here unless one is on already."""
        counted = self._interrupt() is None
        with self._lock:
            if self._since is None:
                self._since = (now, self.clock.wall())
                self._said_at = now
                if self.riding:
                    log.warning(
                        "store unreachable since %s: %s; waiting up to %g s for it (store_outage_s)",
                        _when(self._since[1]),
                        exc,
                        self.patience_s,
                    )
            since, since_wall = self._since
            if counted:
                if not self._waiters:
                    self._waiting_since = now
                self._waiters += 1
        deadline = min([since + self.patience_s, *(t for t in (self.ends_at, self._cap()) if t is not None)])
        return _Wait(since, since_wall, deadline, counted)

    def _still(self, exc: StoreOutage, now: float) -> None:
        with self._lock:
            if not self.riding or self._since is None or now - self._said_at < SAY_EVERY_S:
                return
            self._said_at = now
            since, since_wall = self._since
        log.warning("store still unreachable since %s (%.0f s): %s", _when(since_wall), now - since, exc)

    def _gave_up(self, exc: StoreOutage, wait: _Wait, now: float, why: str | None = None) -> StoreOutage:
        if why is None:
            if self.ends_at is not None and now >= self.ends_at:
                why = "past the job's time limit less its signal grace"
            elif (cap := self._cap()) is not None and now >= cap:
                why = "past the moment its thread had to give up"
            else:
                why = "past store_outage_s"
        since = f"unreachable since {_when(wait.since_wall)} ({now - wait.since:.0f} s)"
        return StoreOutage(f"{exc}; {since}, {why}")

    def _answered(self) -> None:
        if self._since is None:  # the store answers, as it almost always does: no lock taken
            return
        with self._lock:
            if self._since is None:
                return
            (since, since_wall), self._since, self._carried_at = self._since, None, None
        if self.riding:
            log.warning(
                "store answers again after %.0f s (unreachable since %s)",
                self.clock.monotonic() - since,
                _when(since_wall),
            )

    def _stop_waiting(self) -> None:
        """One counted waiter fewer; the last one out adds the wait to the attempt's `store_wait`."""
        with self._lock:
            self._waiters -= 1
            if self._waiters:
                return
            waited = self.clock.monotonic() - self._waiting_since
        spend.count_waited("store_wait", waited)

    def _interrupt(self) -> threading.Event | None:
        return getattr(self._thread, "interrupt", None)

    def _cap(self) -> float | None:
        return getattr(self._thread, "cap", None)

    @contextmanager
    def capped(self, until: float) -> Iterator[None]:
        """Within it, this thread waits for the store no later than `until` (the rider's monotonic clock),
        nor than any cap around it."""
        before = self._cap()
        self._thread.cap = until if before is None else min(before, until)
        try:
            yield
        finally:
            self._thread.cap = before

    @contextmanager
    def background(self, interrupt: threading.Event) -> Iterator[None]:
        """Within it, this thread's waits are not the attempt's (not counted in store_wait) and end as soon
        as `interrupt` is set: a lease keeper's renewals."""
        self._thread.interrupt = interrupt
        try:
            yield
        finally:
            self._thread.interrupt = None

    # -- the processes that wait and watch ------------------------------------------------------------

    def carry_on(self, doing: str) -> None:
        """A waiting process goes on without the store: say so, with `doing` (what it tries again later),
        at most once a minute."""
        now = self.clock.monotonic()
        with self._lock:
            if self._carried_at is not None and now - self._carried_at < SAY_EVERY_S:
                return
            self._carried_at = now
            since = self._since
        log.warning("store unreachable since %s: %s", _when(since[1]) if since else "just now", doing)

    def unless_unreachable(
        self, doing: str, work: Callable[[], T], within_s: float | None = None
    ) -> tuple[bool, T | None]:
        """`work` done (True, its result), or (False, None) where the store stays unreachable (for more
        than `within_s` if given: a poll waits no longer than a poll): a poll, a progress update, goes on
        without it, saying so, and is tried again next time."""
        try:
            if within_s is None:
                return True, work()
            with self.capped(self.clock.monotonic() + within_s):
                return True, work()
        except StoreOutage:
            self.carry_on(f"{doing}: tried again next time")
            return False, None

    def until_answered(
        self, doing: str, work: Callable[[], T], pause: Callable[[float], bool], every_s: float
    ) -> T:
        """`work` (a waiting process's reads and writes), tried again every `every_s` while the store stays
        unreachable (each try waiting no longer), saying so; `pause(seconds)` waits, and returns False
        when the process must stop instead: the last StoreOutage is raised then."""
        while True:
            try:
                with self.capped(self.clock.monotonic() + every_s):
                    return work()
            except StoreOutage:
                self.carry_on(f"{doing}: tried again every {every_s:g} s until it answers")
                if not pause(every_s):
                    raise

    def _check_fence(self, fence: WriteFence | None, key: str) -> None:
        if fence is None or key == fence.exempt or not key.startswith(fence.prefix):
            return
        if fence.lost is not None:
            raise LeaseLost(f"{fence.lost}; refused to write {key!r}")
        if self.clock.monotonic() >= fence.until:
            raise StoreOutage(
                f"{fence.holder}: the lease was not renewed in time and may have expired: no write of the run"
                f" ({key!r}) until it is renewed"
            )


RIDER = Rider()
"""This process's rider: the S3 backend's operations go through it."""

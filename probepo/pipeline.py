"""The driver of a training run: for each update, run the stages that the ledger lacks, in order.

The store is the single source of truth. A stage already committed is skipped, so running the same run id
again resumes it; a stage interrupted mid-way continues from the partial progress it committed. The
driver holds the run's lease so that no second driver works on the same run.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from probepo import __version__
from probepo.config import RunConfig
from probepo.preemption import Preempted, StopFlag
from probepo.stages import STAGES, stages_for_update, warmup
from probepo.stages.context import StageContext
from probepo.store import (
    AlreadyCommitted,
    ArtifactStore,
    Lease,
    LeaseLost,
    Ledger,
    ResumePoint,
    StoreError,
    open_store,
)
from probepo.store.lease import take_lease as store_take_lease

LEASE_TTL_S = 600.0
log = logging.getLogger(__name__)

ProgressFn = Callable[[int, str, dict[str, Any]], None]
"""Called after each stage with (update, stage, summary): the CLI draws progress bars with it."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_stage(ctx: StageContext, stage: str, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run one stage unless the ledger already holds it; returns its committed summary.

    Each attempt leaves a record in the store: written as "running" before the stage starts (so an
    attempt killed outright is still visible) and replaced with its outcome when it ends.
    """
    store, run_id, update = ctx.store, ctx.run_id, ctx.update
    marker = store.marker(run_id, update, stage)
    if marker is None:
        record: dict[str, Any] = {
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": _now(),
            "outcome": "running",
        }
        attempt = store.record_attempt(run_id, update, stage, record)
        ctx.stage_started, ctx.attempt_notes = time.perf_counter(), {}
        try:
            STAGES[stage](ctx)
            record["outcome"] = "committed"
        except AlreadyCommitted:
            record["outcome"] = "lost-race"  # another attempt won; its commit is the truth
        except Preempted:
            record["outcome"] = "preempted"
            raise
        except BaseException as exc:
            record["outcome"] = f"failed: {type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            record.update(ctx.attempt_notes, end=_now())
            store.record_attempt(run_id, update, stage, record, attempt_id=attempt)
        marker = store.marker(run_id, update, stage)
        if marker is None:
            raise RuntimeError(
                f"stage {stage} of update {update} of run {run_id} returned without committing"
            )
    summary = dict(marker.get("summary") or {})
    if progress is not None:
        progress(update, stage, summary)
    return summary


def run_record(config: RunConfig, parts: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What run.json freezes: the config (or some of its parts) and the code version. Where the store
    lives is not part of a run's recipe: a run may be moved or resumed from another store URL."""
    frozen = config.model_dump(mode="json", exclude={"store"})
    if parts is not None:
        frozen = {name: frozen[name] for name in parts}
    return {"config": frozen, "code_version": __version__}


def train(
    config: RunConfig,
    run_id: str,
    *,
    store: ArtifactStore | None = None,
    progress: ProgressFn | None = None,
    tensorboard_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) `run_id` to `config.num_updates` updates; returns the metrics, one record per update.

    A run's recipe is frozen in the store on its first start: resuming with another `config` raises
    RunConfigMismatch naming the differing fields (a resume never silently changes a recipe).
    """
    store = store or open_store(config.store)
    store.create_run(run_id, run_record(config))
    ensure_warmup(config, store, progress)
    logged = {int(m["update"]) for m in store.read_metrics(run_id)}
    writer = _tensorboard(tensorboard_dir)
    flag = StopFlag()
    with (
        flag.installed(),
        LeaseKeeper(take_lease(store, run_id)) as lease,
        tempfile.TemporaryDirectory(prefix=f"probepo-{run_id}-") as scratch,
    ):
        for update in range(config.num_updates + 1):
            ctx = StageContext(store, run_id, update, config, Path(scratch), should_stop=flag)
            record: dict[str, Any] = {"update": update}
            for stage in stages_for_update(config, update):
                summary = run_stage(ctx, stage, progress)
                record.update({f"{stage}/{key}": value for key, value in summary.items()})
                lease.check()
            if update not in logged:
                store.append_metrics(run_id, record)
                if writer is not None:
                    for key, value in record.items():
                        if isinstance(value, int | float) and key != "update":
                            writer.add_scalar(key, value, update)
                    writer.flush()
    return store.read_metrics(run_id)


def resume_point(store: ArtifactStore, run_id: str, config: RunConfig) -> ResumePoint:
    """The first stage the driver would run, with the partial progress committed inside it."""
    order = partial(stages_for_update, config)
    return Ledger(store, run_id).resume_point(order, config.num_updates + 1)


def driver_id() -> str:
    """Who drives the run: the SLURM job (a requeued job keeps its id, so it keeps its lease) or host:pid."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"slurm-job-{job}" if job else f"{socket.gethostname()}:{os.getpid()}"


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


def take_lease(store: ArtifactStore, run_id: str) -> Lease:
    """The run's lease for this driver; a lease left by a dead process of this host is taken over."""
    return store_take_lease(store, run_id, driver_id(), LEASE_TTL_S)


def ensure_warmup(config: RunConfig, store: ArtifactStore, progress: ProgressFn | None = None) -> str:
    """Run the warm-up unless its checkpoint is already committed; returns the warm-up run's id."""
    run_id = warmup.warmup_run_id(config)
    if store.committed(run_id, 0, warmup.STAGE):
        return run_id
    store.create_run(run_id, run_record(config, parts=warmup.KEY_FIELDS))
    with (
        LeaseKeeper(take_lease(store, run_id)),
        tempfile.TemporaryDirectory(prefix=f"probepo-{run_id}-") as scratch,
    ):
        run_stage(StageContext(store, run_id, 0, config, Path(scratch)), warmup.STAGE, progress)
    return run_id


def _tensorboard(logdir: Path | None):
    if logdir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(logdir))

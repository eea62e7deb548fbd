"""Full checkpoints committed beside training: an update ends its optimize once policy k + 1's state is saved
on the node, and the checkpoint's upload and commit marker follow while the next updates generate and train.

    optimize k (every rank)    the state saved to node scratch (blocking: `save`), then `start`: rank 0
                               begins the commit's attempt, each node's leader uploads its node's files on a
                               thread of its own (beside: the checkpoint's own attempt record)
    each later stage boundary  `land` (rank 0): once every uploading rank is done, the marker is created;
                               readers never see a partial checkpoint, retention counts it from then
    the run's end              `finish`: wait for it (blocking: `checkpoint_wait`)
    a stop                     `settle`: finish inside the job's signal grace where the rate measured so far
                               says it fits, else abandon (uploads aborted, scratch freed)
    a failure                  `abandon`

Until its marker lands, policy k + 1 is what it is between full checkpoints: optimize k committed the
fingerprint of the weights it made, so a resume replays it from the full checkpoint before. At most one
checkpoint is in flight: a second waits for the first (`checkpoint_wait`). The leaders of other nodes tell
rank 0 they are done by a small record in the attempt's folder (`uploaded-by-rank-N.json`, deleted once the
marker lands), so that no collective ever runs off a rank's main thread. The run's last checkpoint is
committed inside its optimize, as every checkpoint is where the stages run as jobs of their own: nothing
runs beside them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probepo import spend
from probepo.config import StageResources
from probepo.run import distributed
from probepo.run.faults import fault_point
from probepo.run.preemption import Preempted, StopFlag
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext, file_owners, never_stop
from probepo.store import AlreadyCommitted, ArtifactStore
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import RunLayout, utc_now
from probepo.store.objects import UploadAbandoned, UploadControl
from probepo.store.records import AttemptOutcome

log = logging.getLogger(__name__)

UPLOAD_POINT = "checkpoint.upload"
"""The fault points' stage name of a checkpoint's upload (`<k + 1>:checkpoint.upload:<when>`; started and
uploaded: on the upload's thread, before its first byte and after its last; landed: on rank 0's, its
marker created, the retention it brings not yet run): where the drills stop or kill a driver."""
STOP_MARGIN_S = 5.0
"""Seconds of a stop's signal grace kept for the process's own leaving (not spent on an upload)."""
DEFAULT_SIGNAL_GRACE_S = float(StageResources.model_fields["signal_grace_s"].default)
"""A stop's grace where no job states one (a driver outside SLURM): the profiles' default."""
ABANDON_JOIN_S = 1.0
"""How long an abandoned upload's thread is waited for (it stops at its next read, milliseconds)."""
POLL_S = 0.2
"""How often rank 0 looks for the other nodes' records while it waits."""


def manifest_name(rank: int) -> str:
    return f"uploaded-by-rank-{rank}.json"


@dataclass
class _Upload:
    """One checkpoint in flight, as one rank sees it."""

    run_id: str
    update: int
    attempt: str
    folder: Path
    summary: dict[str, Any]
    uploaders: list[int]
    """The ranks that upload some of its files (rank 0 among them)."""
    nbytes: int
    """This rank's bytes to upload."""
    control: UploadControl = field(default_factory=UploadControl)
    counters: spend.Spend = field(default_factory=spend.Spend)
    started: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=utc_now)
    thread: threading.Thread | None = None
    digests: dict[str, dict[str, Any]] | None = None
    error: str | None = None

    @property
    def uploading(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def seconds_left(self) -> float | None:
        """This rank's upload's remaining seconds at the rate measured so far (None: nothing read yet)."""
        elapsed, done = time.monotonic() - self.started, self.control.bytes_read
        if done == 0 or elapsed <= 0:
            return None
        return (self.nbytes - done) / (done / elapsed)


class CheckpointUploads:
    """A rank's checkpoint in flight (at most one): started by optimize, landed by rank 0's driver.

    `stop`: the process's stop flag (`settle` and the landing's fault point read it; never a collective).
    `signal_grace_s`: how long a stop leaves the job (the profile's, for the driver; None: the profiles'
    default, where no job states one).
    `on_landed(update)`: called on rank 0 when a checkpoint's marker is created (retention).
    `job_id`: the driver's job, which the checkpoint's own attempt record names."""

    def __init__(
        self,
        stop: StopFlag,
        signal_grace_s: float | None,
        on_landed: Callable[[int], None] | None = None,
        job_id: str | None = None,
    ) -> None:
        self.stop, self.on_landed, self.job_id = stop, on_landed, job_id
        self.signal_grace_s = DEFAULT_SIGNAL_GRACE_S if signal_grace_s is None else signal_grace_s
        self._upload: _Upload | None = None

    @contextmanager
    def until_landed(self, store: ArtifactStore) -> Iterator[None]:
        """Around a driver's updates (or a follower rank's stages): at their end the checkpoint in flight
        lands (`finish`); a stop, raised as Preempted or only flagged (a follower whose rank 0 stopped),
        settles it (`settle`); any other failure abandons it."""
        try:
            yield
        except Preempted:
            self.settle(store)
            raise
        except BaseException:
            self.abandon(store)
            raise
        if self.stop():
            self.settle(store)
        else:
            self.finish(store)

    def in_flight(self, update: int) -> bool:
        """Whether checkpoint `update` is uploading (its marker not yet created)."""
        return self._upload is not None and self._upload.update == update

    def start(
        self, ctx: StageContext, folder: Path, files: Mapping[str, Path], summary: Mapping[str, Any]
    ) -> None:
        """Commit `files` (policy k + 1's state, saved into `folder` of each node's scratch, which is now
        this object's to delete) as checkpoint k + 1 beside the next updates. Collective: every rank of the
        stage calls it. A checkpoint still in flight lands first."""
        self.finish(ctx.store)
        update = ctx.update + 1
        attempt = None
        if distributed.rank() == 0:
            with contextlib.suppress(AlreadyCommitted):  # an earlier attempt's marker: nothing to upload
                attempt = ctx.store.begin_commit(ctx.run_id, update, Stage.CHECKPOINT)
        attempt = distributed.broadcast_json(attempt)
        if attempt is None:
            if distributed.is_node_leader():
                _remove(folder)
            return
        owners = file_owners(files) if distributed.world_size() > 1 else dict.fromkeys(files, 0)
        mine = {name: Path(files[name]) for name, owner in owners.items() if owner == distributed.rank()}
        upload = _Upload(
            ctx.run_id,
            update,
            attempt,
            folder,
            dict(summary),
            sorted(set(owners.values())),
            sum(path.stat().st_size for path in mine.values()),
        )
        self._upload = upload
        if mine:
            upload.thread = threading.Thread(
                target=self._send, args=(ctx.store, upload, mine), name=f"checkpoint-{update}", daemon=True
            )
            upload.thread.start()
        elif distributed.is_node_leader():
            _remove(folder)  # its node's files are another rank's to send

    def _send(self, store: ArtifactStore, upload: _Upload, files: Mapping[str, Path]) -> None:
        """The upload thread: this rank's files into the attempt's folder, then (another node's leader) the
        record that says so; the saved state leaves the node's scratch however it ends."""
        rank = distributed.rank()
        with spend.counting_into(upload.counters):
            try:
                with spend.timed("commit"):
                    # a pause here holds the upload, as a slow store would, until the drill lets it go,
                    # whatever stop comes meanwhile
                    fault_point(upload.update, UPLOAD_POINT, "started", never_stop)
                    upload.digests = store.upload_attempt_files(
                        upload.run_id, upload.update, Stage.CHECKPOINT, upload.attempt, files, upload.control
                    )
                    fault_point(upload.update, UPLOAD_POINT, "uploaded", never_stop)
            except UploadAbandoned:
                upload.error = "abandoned"
            except Exception as exc:  # a store that gave up: the checkpoint is not committed, nothing else
                upload.error = f"{type(exc).__name__}: {exc}"[:500]
            finally:
                if distributed.is_node_leader():
                    _remove(upload.folder)
        if rank != 0:
            report = {"digests": upload.digests, "error": upload.error}
            try:
                store.objects.put_bytes(_manifest_key(upload, rank), to_json_bytes(report))
            except Exception as exc:  # rank 0 then waits for it until its own deadline, and gives up
                log.warning(
                    "checkpoint %d: could not tell rank 0 this rank's upload ended: %s", upload.update, exc
                )

    def land(self, store: ArtifactStore) -> bool:
        """Rank 0, at a safe point: create the marker of a checkpoint whose every upload is done (a failed
        one is given up: policy k + 1 stays reachable by replay). Returns whether none is in flight now."""
        upload = self._upload
        if upload is None:
            return True
        if upload.uploading:
            return False
        if distributed.rank() != 0:
            self._upload = None
            return True
        reports = {0: {"digests": upload.digests, "error": upload.error}}
        for rank in upload.uploaders:
            if rank != 0 and (report := _read_manifest(store, upload, rank)) is not None:
                reports[rank] = report
        if len(reports) < len(upload.uploaders):
            return False  # another node still uploads
        self._upload = None
        errors = [f"rank {rank}: {r['error']}" for rank, r in reports.items() if r["error"]]
        if errors:
            log.warning(
                "checkpoint %d of run %s was not committed (%s); policy %d stays reachable by replay from the"
                " full checkpoint before it",
                upload.update, upload.run_id, "; ".join(errors), upload.update,
            )  # fmt: skip
            _discard(store, upload)
            return True
        digests = {name: d for r in reports.values() for name, d in (r["digests"] or {}).items()}
        try:
            store.finish_commit(upload.run_id, upload.update, Stage.CHECKPOINT, upload.attempt, digests,
                                summary=upload.summary)  # fmt: skip
        except AlreadyCommitted:
            return True
        _delete_manifests(store, upload)
        record = {**_beside_record(upload), "job_id": self.job_id}
        store.record_attempt(upload.run_id, upload.update, Stage.CHECKPOINT, record)
        fault_point(upload.update, UPLOAD_POINT, "landed", self.stop)
        if self.on_landed is not None:
            self.on_landed(upload.update)
        return True

    def finish(self, store: ArtifactStore) -> None:
        """Wait until the checkpoint in flight has landed (blocking the update: `checkpoint_wait`)."""
        if self._upload is None:
            return
        with spend.timed("checkpoint_wait"):
            while not self.land(store):
                if self._upload is not None and self._upload.thread is not None:
                    self._upload.thread.join(POLL_S)
                else:
                    time.sleep(POLL_S)

    def settle(self, store: ArtifactStore) -> None:
        """A stop: finish the upload inside the signal grace where its measured rate says it fits, else (or
        once the grace is spent) abandon it. Nothing committed is lost either way: without the marker the
        resume replays policy k + 1 from the full checkpoint before."""
        upload = self._upload
        if upload is None:
            return
        stopped = self.stop.raised_at or time.monotonic()
        deadline = stopped + max(0.0, self.signal_grace_s - STOP_MARGIN_S)
        left = upload.seconds_left()
        if upload.uploading and left is not None and time.monotonic() + left > deadline:
            log.info(
                "checkpoint %d: %.0f s of upload left, past the stop's grace: abandoned", upload.update, left
            )
            self.abandon(store)
            return
        while not self.land(store):
            if time.monotonic() > deadline:
                log.info("checkpoint %d: not uploaded within the stop's grace: abandoned", upload.update)
                self.abandon(store)
                return
            if upload.thread is not None:
                upload.thread.join(POLL_S)

    def abandon(self, store: ArtifactStore) -> None:
        """Give the checkpoint in flight up: its uploads end at their next read (partial objects removed),
        its saved state leaves the scratch, and rank 0 removes what of it reached the store."""
        upload, self._upload = self._upload, None
        if upload is None:
            return
        upload.control.abandon.set()
        if upload.thread is not None:  # it ends at its next read; one held (an outage, a drill) is left
            upload.thread.join(timeout=ABANDON_JOIN_S)
        if distributed.is_node_leader():
            _remove(upload.folder)
        if distributed.rank() == 0:
            _discard(store, upload)


def _manifest_key(upload: _Upload, rank: int) -> str:
    layout = RunLayout(upload.run_id)
    return layout.data_key(upload.update, Stage.CHECKPOINT, upload.attempt, manifest_name(rank))


def _read_manifest(store: ArtifactStore, upload: _Upload, rank: int) -> dict[str, Any] | None:
    key = _manifest_key(upload, rank)
    if not store.objects.exists(key):
        return None
    return from_json_bytes(store.objects.get_bytes(key))


def _delete_manifests(store: ArtifactStore, upload: _Upload) -> None:
    for rank in upload.uploaders:
        if rank != 0:
            try:
                store.objects.delete(_manifest_key(upload, rank))
            except Exception as exc:  # an extra small file in a committed attempt's folder: harmless
                log.warning(
                    "checkpoint %d: could not delete rank %d's upload record: %s", upload.update, rank, exc
                )


def _discard(store: ArtifactStore, upload: _Upload) -> None:
    """Best effort: what of an uncommitted checkpoint reached the store (`probepo store gc` would)."""
    store.discard_attempt(upload.run_id, upload.update, Stage.CHECKPOINT, upload.attempt)


def _beside_record(upload: _Upload) -> dict[str, Any]:
    """The checkpoint's own attempt record: what its upload spent beside the updates (rank 0's)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": upload.started_at,
        "end": utc_now(),
        "outcome": AttemptOutcome.COMMITTED,
        "beside": True,
        "upload_s": round(time.monotonic() - upload.started, 3),
        "spend": upload.counters.as_record(),
    }


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)

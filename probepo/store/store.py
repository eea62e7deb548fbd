"""The artifact store: the commit protocol, run metadata, metrics, attempts, verification and gc.

Written once on top of the object layer (`ObjectStore`), so the local-folder and S3 backends share every
rule. The protocol (DESIGN.md, "The store"):

1. A stage's files go under a fresh attempt folder `updates/<k>/<stage>/<attempt>/` (checkpoints:
   `checkpoints/<k>/<attempt>/`), each hashed on the way.
2. The commit marker `ledger/<k>/<stage>.json` lists every file with size and sha256, and is written with
   a create-only write. Exactly one attempt's marker wins; the others get AlreadyCommitted.
3. Readers follow markers only and verify every byte against them.
4. A corrupt commit is moved aside by `invalidate` (kept under `quarantine/`), after which the stage can
   be committed again; a healthy commit is never overwritten.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from pathlib import Path
from typing import Any

from probepo import spend
from probepo.store import keys
from probepo.store.errors import (
    AlreadyCommitted,
    CorruptArtifact,
    FormatError,
    InvalidKey,
    NotCommitted,
    ObjectMissing,
    RunConfigMismatch,
    RunNotFound,
    StoreError,
)
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import RunLayout, new_attempt_id, utc_now
from probepo.store.lease import Lease, acquire_lease
from probepo.store.maintenance import Maintenance
from probepo.store.objects import Digest, ObjectStore, UploadControl
from probepo.store.records import RunRecords

log = logging.getLogger("probepo.store")

MARKER_FORMAT = "probepo.commit/1"
MARKER_NAME = "<commit marker>"
UPLOAD_WORKERS = 16
_HEX = frozenset("0123456789abcdef")


def differing_fields(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths at which two JSON documents differ (e.g. `config.algo.kappa`), sorted."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [path or "<root>"] if old != new else []
    return sorted(
        field
        for key in set(old) | set(new)
        for field in differing_fields(old.get(key), new.get(key), f"{path}.{key}" if path else key)
    )


def parse_marker(raw: bytes, run_id: str, update: int, stage: str) -> dict[str, Any]:
    """Decode and check a marker; names in it are validated because the bucket may not be trusted."""
    try:
        marker = from_json_bytes(raw)
    except FormatError as exc:
        raise CorruptArtifact(run_id, update, stage, MARKER_NAME, str(exc)) from None
    expected = {"format": MARKER_FORMAT, "run_id": run_id, "update": update, "stage": stage}
    if not isinstance(marker, dict) or any(marker.get(k) != v for k, v in expected.items()):
        raise CorruptArtifact(
            run_id, update, stage, MARKER_NAME, f"does not describe this stage ({expected})"
        )
    files = marker.get("files")
    try:
        keys.attempt(marker.get("attempt"))
        if not isinstance(files, dict):
            raise InvalidKey("'files' is not an object")
        for name, entry in files.items():
            keys.file_name(name)
            size, sha = entry.get("size"), entry.get("sha256")
            if (
                not isinstance(size, int)
                or size < 0
                or not isinstance(sha, str)
                or len(sha) != 64
                or set(sha) - _HEX
            ):
                raise InvalidKey(f"bad size/sha256 for {name!r}")
    except (InvalidKey, AttributeError) as exc:
        raise CorruptArtifact(run_id, update, stage, MARKER_NAME, f"malformed: {exc}") from None
    return marker


class StageFiles(Mapping[str, bytes]):
    """The files of one committed stage, fetched lazily and verified against the marker on first access."""

    def __init__(self, store: ArtifactStore, marker: dict[str, Any]) -> None:
        self.marker = marker
        self._store = store
        self._cache: dict[str, bytes] = {}

    @property
    def summary(self) -> dict[str, Any]:
        """The stage's summary recorded in its marker."""
        return dict(self.marker.get("summary") or {})

    def __getitem__(self, name: str) -> bytes:
        if name not in self._cache:
            if name not in self.marker["files"]:
                raise KeyError(name)
            self._cache[name] = self._fetch(name)
        return self._cache[name]

    def prefetch(self, workers: int = UPLOAD_WORKERS) -> StageFiles:
        """Fetch and verify every file not yet fetched, `workers` at a time (for stages with many files)."""
        missing = [name for name in self.marker["files"] if name not in self._cache]
        with ThreadPoolExecutor(max(1, min(workers, len(missing)))) as pool:
            for name, data in zip(missing, pool.map(self._fetch, missing), strict=True):
                self._cache[name] = data
        return self

    def _fetch(self, name: str) -> bytes:
        return self._store._fetch_verified(self.marker, name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.marker["files"]))

    def __len__(self) -> int:
        return len(self.marker["files"])


class ArtifactStore(RunRecords, Maintenance):
    """One interface over both backends; see the module docstring for the protocol."""

    parse_marker = staticmethod(parse_marker)

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    @property
    def url(self) -> str:
        """Where the store lives (no credentials)."""
        return self.objects.url

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # -- runs --------------------------------------------------------------------------------------

    def runs(self) -> list[str]:
        """Run ids present in the store."""
        return [name for name in self.objects.list_children("runs/") if self._valid_run_id(name)]

    @staticmethod
    def _valid_run_id(name: str) -> bool:
        try:
            keys.run_id(name)
        except InvalidKey:
            return False
        return True

    def create_run(self, run_id: str, config: dict[str, Any]) -> dict[str, Any]:
        """Freeze a run's record in run.json (create-only); an identical existing record is returned as is."""
        layout = RunLayout(run_id)
        raw = to_json_bytes(config)
        if self.objects.put_if_absent(layout.run_json, raw) is not None:
            return from_json_bytes(raw)
        existing = self.read_run(run_id)
        wanted = from_json_bytes(raw)  # compare after the same JSON round trip (tuples become lists, ...)
        if existing != wanted:
            raise RunConfigMismatch(run_id, differing_fields(existing, wanted))
        return existing

    def read_run(self, run_id: str) -> dict[str, Any]:
        """The run's frozen record; raises RunNotFound."""
        try:
            return from_json_bytes(self.objects.get_bytes(RunLayout(run_id).run_json))
        except ObjectMissing:
            raise RunNotFound(self.url, run_id) from None

    # -- commits -----------------------------------------------------------------------------------

    def commit_stage(
        self,
        run_id: str,
        update: int,
        stage: str,
        files: Mapping[str, bytes | PathLike[str]],
        *,
        summary: Mapping[str, Any] | None = None,
        attempt_record: str | None = None,
    ) -> dict[str, Any]:
        """Stage `files` under a fresh attempt folder, then create the commit marker; returns the marker.

        Values are bytes or paths (streamed and hashed while uploading). `summary` (JSON-able) is stored
        in the marker; `attempt_record` optionally links the id returned by `record_attempt`. Raises
        AlreadyCommitted if another attempt's marker exists or wins the race.
        """
        for name in files:
            keys.file_name(name)
        from_json_bytes(to_json_bytes(dict(summary or {})))  # fail before uploading anything
        attempt = self.begin_commit(run_id, update, stage)
        digests = self.upload_attempt_files(run_id, update, stage, attempt, files)
        return self.finish_commit(
            run_id, update, stage, attempt, digests, summary=summary, attempt_record=attempt_record
        )

    def begin_commit(self, run_id: str, update: int, stage: str) -> str:
        """A fresh attempt id for a commit of the stage, whose files then go up with upload_attempt_files
        (from any number of processes: the ranks of several nodes each upload their own) and whose marker
        finish_commit creates. Raises AlreadyCommitted if the stage is committed already."""
        if self.objects.exists(RunLayout(run_id).marker(update, stage)):
            raise AlreadyCommitted(run_id, update, stage, self.marker(run_id, update, stage))
        return new_attempt_id()

    def upload_attempt_files(
        self,
        run_id: str,
        update: int,
        stage: str,
        attempt: str,
        files: Mapping[str, bytes | PathLike[str]],
        control: UploadControl | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Upload `files` (bytes, or paths streamed and hashed while uploading) into the attempt's folder,
        in parallel; returns each file's `{"size", "sha256"}` as the marker records it. `control` counts the
        bytes of files read, and ends the uploads at their next read once its `abandon` is set
        (UploadAbandoned), leaving nothing behind."""
        layout = RunLayout(run_id)
        counters = spend.current()  # the worker threads count where their caller does

        def upload(name: str) -> tuple[str, Digest]:
            key = layout.data_key(update, stage, attempt, keys.file_name(name))
            value = files[name]
            with spend.counting_into(counters):
                if isinstance(value, bytes | bytearray | memoryview):
                    data = bytes(value)
                    self.objects.put_bytes(key, data)
                    return name, Digest.of(data)
                return name, self.objects.put_file(key, Path(value), control)

        names = list(files)
        if len(names) > 1:
            with ThreadPoolExecutor(min(UPLOAD_WORKERS, len(names))) as pool:
                digests = dict(pool.map(upload, names))
        else:
            digests = dict(map(upload, names))
        spend.count("uploaded", sum(d.size for d in digests.values()))
        return {name: {"size": d.size, "sha256": d.sha256} for name, d in digests.items()}

    def finish_commit(
        self,
        run_id: str,
        update: int,
        stage: str,
        attempt: str,
        files: Mapping[str, Mapping[str, Any]],
        *,
        summary: Mapping[str, Any] | None = None,
        attempt_record: str | None = None,
    ) -> dict[str, Any]:
        """Create the marker of an attempt whose `files` (name: size and sha256, from upload_attempt_files)
        are uploaded; returns it. Raises AlreadyCommitted (the attempt's files discarded) if another
        attempt's marker won the race."""
        layout = RunLayout(run_id)
        marker: dict[str, Any] = {
            "format": MARKER_FORMAT,
            "run_id": run_id,
            "update": update,
            "stage": stage,
            "attempt": attempt,
            "attempt_record": attempt_record,
            "files": {name: dict(files[name]) for name in sorted(files)},
            "summary": from_json_bytes(to_json_bytes(dict(summary or {}))),
            "committed_at": utc_now(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        if self.objects.put_if_absent(layout.marker(update, stage), to_json_bytes(marker)) is None:
            winner = self.marker(run_id, update, stage)
            self._discard_attempt(layout.attempt_dir(update, stage, attempt))
            raise AlreadyCommitted(run_id, update, stage, winner)
        return marker

    def discard_attempt(self, run_id: str, update: int, stage: str, attempt: str) -> None:
        """Best effort: the files of an attempt that will not be committed (an abandoned upload)."""
        self._discard_attempt(RunLayout(run_id).attempt_dir(update, stage, attempt))

    def _discard_attempt(self, prefix: str) -> None:
        """Best effort: a losing attempt's files are unreferenced; gc would collect them otherwise."""
        try:
            for info in list(self.objects.list(prefix)):
                self.objects.delete(info.key)
            self.objects.prune_empty(prefix)
        except StoreError as exc:
            log.warning("could not discard losing attempt %s (gc will): %s", prefix, exc)

    def marker(self, run_id: str, update: int, stage: str) -> dict[str, Any] | None:
        """The commit marker of a stage, or None if not committed; raises CorruptArtifact if unreadable."""
        try:
            raw = self.objects.get_bytes(RunLayout(run_id).marker(update, stage))
        except ObjectMissing:
            return None
        return parse_marker(raw, run_id, update, stage)

    def committed(self, run_id: str, update: int, stage: str) -> bool:
        """Whether the stage has a commit marker."""
        return self.objects.exists(RunLayout(run_id).marker(update, stage))

    def ledger_entries(self, run_id: str) -> dict[int, list[str]]:
        """Committed stages of every update, from one listing of the ledger."""
        layout = RunLayout(run_id)
        entries: dict[int, list[str]] = {}
        for info in self.objects.list(layout.ledger_root):
            relative = info.key[len(layout.ledger_root) :]
            folder, _, name = relative.partition("/")
            if not (folder.isdigit() and len(folder) == 6 and name.endswith(".json") and "/" not in name):
                log.warning("ignoring unexpected ledger object %s", info.key)
                continue
            entries.setdefault(int(folder), []).append(name.removesuffix(".json"))
        return {update: sorted(stages) for update, stages in sorted(entries.items())}

    def committed_stages(self, run_id: str, update: int) -> list[str]:
        """Stages (and sub-stages) committed for one update, sorted."""
        prefix = RunLayout(run_id).ledger_dir(update)
        return sorted(
            info.key[len(prefix) :].removesuffix(".json")
            for info in self.objects.list(prefix)
            if "/" not in info.key[len(prefix) :]
        )

    def updates(self, run_id: str) -> list[int]:
        """Updates with at least one committed stage, ascending."""
        return list(self.ledger_entries(run_id))

    def _require_marker(self, run_id: str, update: int, stage: str) -> dict[str, Any]:
        marker = self.marker(run_id, update, stage)
        if marker is None:
            raise NotCommitted(run_id, update, stage)
        return marker

    def read_stage(self, run_id: str, update: int, stage: str) -> StageFiles:
        """The committed files of a stage as a lazy mapping; each file is verified when first accessed.

        Raises NotCommitted, or CorruptArtifact (naming run, update, stage and file) on a mismatch.
        """
        return StageFiles(self, self._require_marker(run_id, update, stage))

    def _fetch_verified(self, marker: dict[str, Any], name: str) -> bytes:
        run_id, update, stage = marker["run_id"], marker["update"], marker["stage"]
        key = RunLayout(run_id).data_key(update, stage, marker["attempt"], name)
        try:
            with spend.timed("download"):
                data = self.objects.get_bytes(key)
        except ObjectMissing:
            raise CorruptArtifact(run_id, update, stage, name, "file missing from the store") from None
        spend.count("downloaded", len(data))
        self._check_digest(marker, name, Digest.of(data))
        return data

    @staticmethod
    def _check_digest(marker: dict[str, Any], name: str, actual: Digest) -> None:
        expected = marker["files"][name]
        if actual.size != expected["size"] or actual.sha256 != expected["sha256"]:
            raise CorruptArtifact(
                marker["run_id"],
                marker["update"],
                marker["stage"],
                name,
                f"expected {expected['size']} bytes sha256 {expected['sha256'][:16]}…, "
                f"found {actual.size} bytes sha256 {actual.sha256[:16]}…",
            )

    def download_stage_file(
        self, run_id: str, update: int, stage: str, name: str, dest: str | PathLike[str]
    ) -> Path:
        """Stream one committed file to `dest` (never whole in memory), verified before it appears there."""
        marker = self._require_marker(run_id, update, stage)
        if name not in marker["files"]:
            raise ObjectMissing(f"run {run_id!r} update {update} stage {stage!r} has no file {name!r}")
        target = Path(dest)
        partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:8]}")
        key = RunLayout(run_id).data_key(update, stage, marker["attempt"], name)
        try:
            try:
                with spend.timed("download"):
                    digest = self.objects.download_file(key, partial)
            except ObjectMissing:
                raise CorruptArtifact(run_id, update, stage, name, "file missing from the store") from None
            spend.count("downloaded", digest.size)
            self._check_digest(marker, name, digest)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return target

    # -- lease -------------------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, holder: str, ttl_s: float, *, force: bool = False) -> Lease:
        """Take the run's lease (see probepo.store.lease.acquire_lease)."""
        return acquire_lease(self, run_id, holder, ttl_s, force=force)

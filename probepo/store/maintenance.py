"""Keeping a store healthy: re-checking every checksum, setting a corrupt commit aside, and collecting
the attempt folders no marker names and the evaluation shards no evaluation will read."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from probepo.run.schedule import Stage
from probepo.store.errors import CorruptArtifact, NotCommitted, ObjectMissing, StoreError
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import RunLayout, new_attempt_id, utc_now
from probepo.store.lease import take_lease
from probepo.store.retention import holds

if TYPE_CHECKING:
    from probepo.store.objects import ObjectStore

DEFAULT_GC_MIN_AGE_S = 6 * 3600.0
INVALIDATE_LEASE_TTL_S = 300.0
log = logging.getLogger("probepo.store")


@dataclass
class VerifyReport:
    """What `verify` checked and what it found."""

    stages: int = 0
    files: int = 0
    bytes: int = 0
    problems: list[CorruptArtifact] = field(default_factory=list)


@dataclass
class GcReport:
    """Orphaned attempt folders and evaluation shards found (and removed unless dry run), and those kept
    because too young."""

    removed: list[str] = field(default_factory=list)
    bytes: int = 0
    kept_young: list[str] = field(default_factory=list)


class Maintenance:
    """verify, invalidate and gc (mixed into ArtifactStore, which provides the marker and digest checks)."""

    objects: ObjectStore

    def stage_problems(self, run_id: str, update: int, stage: str) -> tuple[list[CorruptArtifact], int, int]:
        """Re-check every file of a committed stage by streaming it: (problems, files checked, bytes)."""
        try:
            marker = self._require_marker(run_id, update, stage)
        except CorruptArtifact as exc:
            return [exc], 0, 0
        layout = RunLayout(run_id)
        problems: list[CorruptArtifact] = []
        total = 0
        for name in sorted(marker["files"]):
            try:
                digest = self.objects.digest(layout.data_key(update, stage, marker["attempt"], name))
                total += digest.size
                self._check_digest(marker, name, digest)
            except ObjectMissing:
                problems.append(CorruptArtifact(run_id, update, stage, name, "file missing from the store"))
            except CorruptArtifact as exc:
                problems.append(exc)
        return problems, len(marker["files"]), total

    def verify(self, run_id: str) -> VerifyReport:
        """Re-check every checksum of every committed stage of a run."""
        self.read_run(run_id)
        report = VerifyReport()
        for update, stages in self.ledger_entries(run_id).items():
            for stage in stages:
                problems, files, size = self.stage_problems(run_id, update, stage)
                report.stages += 1
                report.files += files
                report.bytes += size
                report.problems.extend(problems)
        return report

    def invalidate(self, run_id: str, update: int, stage: str, *, force: bool = False) -> dict[str, Any]:
        """Move a corrupt commit's marker aside (to quarantine/, never deleted) so the stage can be redone.

        Refuses (StoreError) when every file checks out, unless `force`. Returns the quarantine record.
        """
        layout = RunLayout(run_id)
        key = layout.marker(update, stage)
        current = self.objects.get_versioned(key)
        if current is None:
            raise NotCommitted(run_id, update, stage)
        problems, _, _ = self.stage_problems(run_id, update, stage)
        if not problems and not force:
            raise StoreError(
                f"refusing to invalidate run {run_id!r} update {update} stage {stage!r}: every file "
                "checks out against its marker; pass force=True (--force) to recompute a healthy stage anyway"
            )
        tag = new_attempt_id()
        record = {
            "invalidated_at": utc_now(),
            "forced": force,
            "problems": [str(problem) for problem in problems],
            "marker_raw": current.data.decode("utf-8", errors="replace"),
        }
        self.objects.put_bytes(layout.quarantined(update, stage, tag), to_json_bytes(record))
        if not self._delete_marker(run_id, key, current.etag):
            raise StoreError(
                f"the marker of run {run_id!r} update {update} stage {stage!r} changed while "
                "invalidating it; check it again"
            )
        log.warning("invalidated run %s update %d stage %s: %s", run_id, update, stage, record["problems"])
        return record

    def _delete_marker(self, run_id: str, key: str, etag: str) -> bool:
        """Delete a marker only if it is still version `etag`. Where DELETE ignores If-Match (Ceph RGW 16),
        check and delete while holding the run's lease: whatever else changes a marker (a driver, `probepo
        store gc`) holds it too, so the check still holds at the delete; a live driver raises LeaseHeld."""
        if self.objects.honours_conditional_delete():
            return self.objects.delete_if_match(key, etag)
        holder = f"probepo-store-invalidate@{socket.gethostname()}:{os.getpid()}"
        with take_lease(self, run_id, holder, INVALIDATE_LEASE_TTL_S):  # type: ignore[arg-type]  # a mixin
            current = self.objects.get_versioned(key)
            if current is None or current.etag != etag:
                return False
            self.objects.delete(key)
            return True

    # -- garbage collection ------------------------------------------------------------------------

    def _live_attempt_dirs(self, run_id: str) -> tuple[set[str], set[tuple[int, str]]]:
        """Attempt folders named by a marker (committed or quarantined), and stages whose marker is unreadable
        (all of whose attempts are kept, to be safe)."""
        layout = RunLayout(run_id)
        live: set[str] = set()
        unsure: set[tuple[int, str]] = set()
        for update, stages in self.ledger_entries(run_id).items():
            for stage in stages:
                try:
                    marker = self._require_marker(run_id, update, stage)
                    live.add(layout.attempt_dir(update, stage, marker["attempt"]))
                except (CorruptArtifact, NotCommitted):
                    unsure.add((update, stage))
        for info in self.objects.list(layout.quarantine_root):
            parts = info.key[len(layout.quarantine_root) :].split("/")
            try:
                update, stage = int(parts[0]), parts[1]
                raw = from_json_bytes(self.objects.get_bytes(info.key))["marker_raw"].encode()
                marker = self.parse_marker(raw, run_id, update, stage)
                live.add(layout.attempt_dir(update, stage, marker["attempt"]))
            except (ValueError, IndexError, KeyError, TypeError, StoreError):
                if len(parts) > 1 and parts[0].isdigit():
                    unsure.add((int(parts[0]), parts[1]))
        return live, unsure

    @staticmethod
    def _attempt_dir_of(layout: RunLayout, key: str) -> tuple[str, int, str] | None:
        """(attempt folder key ending in '/', update, stage) of a data key, or None if not one."""
        parts = key[len(layout.root) :].split("/")
        if parts[0] == "updates" and len(parts) >= 5 and parts[1].isdigit():
            return layout.root + "/".join(parts[:4]) + "/", int(parts[1]), parts[2]
        if parts[0] == "checkpoints" and len(parts) >= 4 and parts[1].isdigit():
            return layout.root + "/".join(parts[:3]) + "/", int(parts[1]), Stage.CHECKPOINT
        return None

    def gc(self, run_id: str, *, min_age_s: float = DEFAULT_GC_MIN_AGE_S, dry_run: bool = False) -> GcReport:
        """Delete attempt folders no marker names (lost races, killed writers) once older than `min_age_s`,
        and the orphaned shards of evaluations after the fact (`_orphaned_evaluation_shards`).

        The age guard protects an attempt still uploading (its marker does not exist yet); run gc while
        holding the run's lease (the CLI does) so that no driver is working on the run.
        """
        layout = RunLayout(run_id)
        self.read_run(run_id)
        live, unsure = self._live_attempt_dirs(run_id)
        folders: dict[str, tuple[float, int, bool]] = {}
        now = datetime.now(UTC).timestamp()
        for data_root in layout.data_roots:
            for info in self.objects.list(data_root):
                found = self._attempt_dir_of(layout, info.key)
                if found is None:
                    continue
                folder, update, stage = found
                newest, size, keep = folders.get(folder, (0.0, 0, False))
                keep = keep or (update, stage) in unsure
                folders[folder] = (max(newest, info.modified), size + info.size, keep)
        report = GcReport()
        for folder, (newest, size, keep) in sorted(folders.items()):
            relative = folder[len(layout.root) :]
            if folder in live or keep:
                continue
            if now - newest < min_age_s:
                report.kept_young.append(relative)
                continue
            self._remove(folder, relative, size, report, dry_run)
        for folder, (newest, size, complete) in self._orphaned_evaluation_shards(layout).items():
            relative = folder[len(layout.root) :]
            if not complete and now - newest < min_age_s:
                report.kept_young.append(relative)
            else:
                self._remove(folder, relative, size, report, dry_run)
        return report

    def _remove(self, folder: str, relative: str, size: int, report: GcReport, dry_run: bool) -> None:
        report.removed.append(relative)
        report.bytes += size
        if not dry_run:
            for info in list(self.objects.list(folder)):
                self.objects.delete(info.key)
            self.objects.prune_empty(folder)

    def _orphaned_evaluation_shards(self, layout: RunLayout) -> dict[str, tuple[float, int, bool]]:
        """The orphaned shards of evaluations after the fact, by folder: (newest object's time, bytes,
        whether the evaluation is committed). Those of a committed evaluation (its task lost a race, or died
        before dropping them) nothing reads: a task still reading them finds the evaluation and ends
        `exists`. Those of a checkpoint without weights (pruned with --delete-unevaluated, invalidated)
        nothing can finish. The others are a stopped evaluation's progress, which the next night resumes."""
        found: dict[tuple[int, str], tuple[float, int]] = {}
        for info in self.objects.list(layout.evaluation_shards_root):
            parts = info.key[len(layout.evaluation_shards_root) :].split("/")
            if len(parts) >= 3 and parts[0].isdigit():
                newest, size = found.get((int(parts[0]), parts[1]), (0.0, 0))
                found[(int(parts[0]), parts[1])] = (max(newest, info.modified), size + info.size)
        orphaned = {}
        for (update, suite), (newest, size) in sorted(found.items()):
            complete = self.objects.exists(layout.evaluation(update, suite))
            checkpoint = self.marker(layout.run_id, update, Stage.CHECKPOINT)
            if complete or checkpoint is None or holds(checkpoint) == "record":
                orphaned[layout.evaluation_shards(update, suite)] = (newest, size, complete)
        return orphaned

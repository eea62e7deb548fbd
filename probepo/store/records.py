"""What a run records beside its commits: metrics, the attempts at each stage, the jobs submitted for
them, the extensions of its number of updates, its cancellations and the evaluations of its checkpoints.
Small JSON documents, each under its own key."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from probepo.store import keys
from probepo.store.errors import FormatError, ObjectMissing
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import RunLayout, new_attempt_id, utc_now

if TYPE_CHECKING:
    from probepo.store.objects import ObjectStore

log = logging.getLogger("probepo.store")


class AttemptOutcome(StrEnum):
    """How one attempt at a stage ended: its record's `outcome` (a failure's error is in its `error`)."""

    RUNNING = "running"
    """Not ended: still running, or killed outright before it could say."""
    COMMITTED = "committed"
    LOST_RACE = "lost-race"
    """Another attempt committed first; its commit is the truth."""
    PREEMPTED = "preempted"
    """Stopped at a safe point, its progress committed."""
    FAILED = "failed"
    """The stage's own error: the job is not submitted again."""
    RANK_LOST = "rank-lost"
    """Another rank of its job died (a node lost, a process killed) and a collective failed with it: like
    an attempt killed outright, the job is submitted again."""

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> AttemptOutcome | None:
        """The outcome an attempt record states (None if it states none). Records written before the
        outcome and the error were two fields say `failed: <error>`."""
        said = str(record.get("outcome", ""))
        if said.startswith(f"{cls.FAILED}: "):
            return cls.FAILED
        try:
            return cls(said)
        except ValueError:
            return None

    @staticmethod
    def error_of(record: Mapping[str, Any]) -> str:
        """A failed attempt's error, as its record states it."""
        said = str(record.get("outcome", ""))
        return str(record.get("error") or said.removeprefix(f"{AttemptOutcome.FAILED}: "))


class JobOutcome(StrEnum):
    """What the driver made of one job it submitted: its record's `outcome` (and what a job function
    returns, for the ones a job can say itself)."""

    OPEN = "open"
    """No driver has seen it end (pending, running, or ended unseen): a restarted driver re-attaches."""
    COMMITTED = "committed"
    FAILED = "failed"
    """Its stage failed with its own error."""
    DIED = "died"
    """Ended without committing or saying why (killed, node failure, out of memory, time limit)."""
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"


class RunRecords:
    """Records of a run (mixed into ArtifactStore, which provides `objects`, `read_run` and ids)."""

    objects: ObjectStore

    def extend_run(self, run_id: str, *, from_updates: int, to_updates: int) -> dict[str, Any]:
        """Record (create-only) that the run's number of updates was raised; returns the record. Writing
        the same extension again returns the existing record."""
        self.read_run(run_id)
        record = {
            "from": from_updates,
            "to": to_updates,
            "at": utc_now(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        key = RunLayout(run_id).extension(to_updates)
        if self.objects.put_if_absent(key, to_json_bytes(record)) is None:
            return from_json_bytes(self.objects.get_bytes(key))
        return record

    def extensions(self, run_id: str) -> list[dict[str, Any]]:
        """The run's extensions, oldest (fewest updates) first."""
        layout = RunLayout(run_id)
        found = [
            from_json_bytes(self.objects.get_bytes(i.key)) for i in self.objects.list(layout.extensions_root)
        ]
        return sorted(found, key=lambda record: record["to"])

    def record_cancellation(self, run_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
        """Record (create-only) that the run was cancelled, not preempted: who, when, the jobs it ended.
        A later resume goes on from the ledger as after any stop."""
        self.read_run(run_id)
        stamped = {**record, "at": utc_now(), "host": socket.gethostname(), "pid": os.getpid()}
        self.objects.put_if_absent(RunLayout(run_id).cancellation(new_attempt_id()), to_json_bytes(stamped))
        return stamped

    def cancellations(self, run_id: str) -> list[dict[str, Any]]:
        """The run's cancellations, oldest first."""
        root = RunLayout(run_id).cancellations_root
        found = [from_json_bytes(self.objects.get_bytes(i.key)) for i in self.objects.list(root)]
        return sorted(found, key=lambda record: record["at"])

    def record_evaluation(self, run_id: str, checkpoint: int, suite: str, record: Mapping[str, Any]) -> bool:
        """Commit (create-only) the evaluation of checkpoint `checkpoint` on `suite`; False when there is one
        already (another night's, a concurrent evaluation's): the first stays, nothing is overwritten."""
        self.read_run(run_id)
        stamped = {
            **record,
            "checkpoint": checkpoint,
            "suite": suite,
            "at": utc_now(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        key = RunLayout(run_id).evaluation(checkpoint, suite)
        return self.objects.put_if_absent(key, to_json_bytes(stamped)) is not None

    def evaluation(self, run_id: str, checkpoint: int, suite: str) -> dict[str, Any] | None:
        """The evaluation of checkpoint `checkpoint` on `suite`, or None when there is none yet."""
        try:
            return from_json_bytes(self.objects.get_bytes(RunLayout(run_id).evaluation(checkpoint, suite)))
        except ObjectMissing:
            return None

    def evaluations(self, run_id: str) -> dict[tuple[int, str], dict[str, Any]]:
        """The run's checkpoint evaluations by (checkpoint, suite)."""
        found = {}
        for info in self.objects.list(RunLayout(run_id).evaluations_root):
            record = from_json_bytes(self.objects.get_bytes(info.key))
            found[(record["checkpoint"], record["suite"])] = record
        return found

    def commit_evaluation_shard(
        self, run_id: str, checkpoint: int, suite: str, name: str, data: bytes
    ) -> bool:
        """Keep (create-only) one engine call's completions of an evaluation after the fact, so that a task
        stopped midway resumes from it; False when the shard is there already (the same bits)."""
        key = RunLayout(run_id).evaluation_shard(checkpoint, suite, name)
        return self.objects.put_if_absent(key, data) is not None

    def evaluation_shard_names(self, run_id: str, checkpoint: int, suite: str) -> list[str]:
        """The shards an unfinished evaluation of checkpoint `checkpoint` on `suite` has kept, sorted."""
        root = RunLayout(run_id).evaluation_shards(checkpoint, suite)
        return sorted(
            info.key[len(root) :].removesuffix(".parquet")
            for info in self.objects.list(root)
            if info.key.endswith(".parquet") and "/" not in info.key[len(root) :]
        )

    def read_evaluation_shard(self, run_id: str, checkpoint: int, suite: str, name: str) -> bytes:
        return self.objects.get_bytes(RunLayout(run_id).evaluation_shard(checkpoint, suite, name))

    def record_evaluation_job(self, run_id: str, checkpoint: int, suite: str, job: str) -> None:
        """Note (create-only) that the scheduler's job `job` (as accounting names it) works on the unfinished
        evaluation of checkpoint `checkpoint` on `suite`: whichever night commits it counts this job's
        GPU-hours too."""
        key = RunLayout(run_id).evaluation_job(checkpoint, suite, job)
        self.objects.put_if_absent(
            key, to_json_bytes({"job": job, "at": utc_now(), "host": socket.gethostname()})
        )

    def evaluation_jobs(self, run_id: str, checkpoint: int, suite: str) -> list[str]:
        """The jobs that worked on the unfinished evaluation of checkpoint `checkpoint` on `suite`, in the
        order they began."""
        root = RunLayout(run_id).evaluation_jobs(checkpoint, suite)
        found = sorted(self.objects.list(root), key=lambda info: (info.modified, info.key))
        return [info.key[len(root) :].removesuffix(".json") for info in found]

    def drop_evaluation_shards(self, run_id: str, checkpoint: int, suite: str) -> int:
        """Delete an evaluation's shards (and its jobs' records) once it is committed (they hold every
        completion: at the study's k, college_math's are ~100 MB a checkpoint); returns how many objects."""
        root = RunLayout(run_id).evaluation_shards(checkpoint, suite)
        found = list(self.objects.list(root))
        for info in found:
            self.objects.delete(info.key)
        self.objects.prune_empty(root)
        return len(found)

    def append_metrics(self, run_id: str, record: dict[str, Any]) -> None:
        """Append one JSON line to metrics.jsonl (local: O_APPEND + fsync; S3: compare-and-swap rewrite)."""
        self.objects.append(RunLayout(run_id).metrics, to_json_bytes(record) + b"\n")

    def read_metrics(self, run_id: str) -> list[dict[str, Any]]:
        """All metric records in append order; a line torn by a crash mid-append is skipped with a warning."""
        try:
            raw = self.objects.get_bytes(RunLayout(run_id).metrics)
        except ObjectMissing:
            return []
        records = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(from_json_bytes(line))
            except FormatError:
                log.warning("skipping unreadable line %d of %s metrics.jsonl (torn write?)", number, run_id)
        return records

    def record_attempt(
        self,
        run_id: str,
        update: int,
        stage: str,
        record: Mapping[str, Any],
        *,
        attempt_id: str | None = None,
    ) -> str:
        """Store one attempt's record (job_id, host, pid, start, end, outcome, ...); returns its id.

        Pass the returned `attempt_id` again to replace the record (e.g. once the attempt ends).
        """
        layout = RunLayout(run_id)
        attempt_id = keys.attempt(attempt_id) if attempt_id else new_attempt_id()
        document = {**record, "attempt_id": attempt_id, "update": update, "stage": keys.stage(stage)}
        self.objects.put_bytes(layout.attempt_record(update, stage, attempt_id), to_json_bytes(document))
        return attempt_id

    def attempts(
        self, run_id: str, update: int | None = None, stage: str | None = None
    ) -> list[dict[str, Any]]:
        """Attempt records, oldest first within each (update, stage); filtered by update and stage."""
        return self._records(RunLayout(run_id).attempts_root, "attempt_id", update, stage)

    def record_job(
        self,
        run_id: str,
        update: int,
        stage: str,
        record: Mapping[str, Any],
        *,
        submission_id: str | None = None,
    ) -> str:
        """Store the driver's record of one job submitted for a stage (executor, job id, state, node,
        resubmissions, ...); returns its id. Written before the driver waits on the job, it is how a
        restarted driver re-attaches instead of submitting again. Pass `submission_id` to replace it."""
        layout = RunLayout(run_id)
        submission_id = keys.attempt(submission_id) if submission_id else new_attempt_id()
        document = {**record, "submission_id": submission_id, "update": update, "stage": keys.stage(stage)}
        self.objects.put_bytes(layout.job_record(update, stage, submission_id), to_json_bytes(document))
        return submission_id

    def jobs(self, run_id: str, update: int | None = None, stage: str | None = None) -> list[dict[str, Any]]:
        """Job records, oldest first within each (update, stage); filtered by update and stage."""
        return self._records(RunLayout(run_id).jobs_root, "submission_id", update, stage)

    def _records(
        self, root: str, id_field: str, update: int | None, stage: str | None
    ) -> list[dict[str, Any]]:
        prefix = root
        if update is not None:
            prefix += f"{keys.update(update):06d}/"
            if stage is not None:
                prefix += f"{keys.stage(stage)}/"
        records = []
        for info in self.objects.list(prefix):
            record = from_json_bytes(self.objects.get_bytes(info.key))
            if stage is None or record.get("stage") == stage:
                records.append(record)
        return sorted(records, key=lambda r: (r.get("update", 0), r.get("stage", ""), r.get(id_field, "")))

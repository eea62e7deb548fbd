"""Validation of everything that becomes part of an object key, and the run layout built from it.

Every key the store touches is built here from validated parts, and names read back from a marker (which
may come from an untrusted bucket) are validated again, so no key can escape the run's prefix.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from probepo.run.schedule import Stage
from probepo.store.errors import InvalidKey

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_STAGE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_FILE_PART = re.compile(r"[A-Za-z0-9_=+@,-][A-Za-z0-9._=+@,-]{0,254}")
_ATTEMPT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_KEY_LENGTH = 1024


def utc_now() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def new_attempt_id() -> str:
    """A fresh, sortable, unique attempt (or submission) id: UTC time then random hex."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}Z-{uuid.uuid4().hex[:12]}"


def _check(pattern: re.Pattern[str], value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise InvalidKey(f"invalid {what} {value!r}: must match {pattern.pattern} and contain no '..'")
    return value


def run_id(value: object) -> str:
    """A run id: letters, digits, '.', '_', '-', starting with a letter or digit."""
    return _check(_RUN_ID, value, "run id")


def stage(value: object) -> str:
    """A stage name: lowercase `[a-z0-9][a-z0-9._-]*`; sub-stages such as `optimize.part-0003` fit too."""
    return _check(_STAGE, value, "stage name")


def attempt(value: object) -> str:
    """An attempt id (a folder name)."""
    return _check(_ATTEMPT, value, "attempt id")


def update(value: object) -> int:
    """An update index: a non-negative int below 10**6 (keys are zero-padded to six digits)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**6:
        raise InvalidKey(f"invalid update {value!r}: must be an int in [0, 999999]")
    return value


def file_name(value: object) -> str:
    """A file name inside a stage: a relative POSIX path whose parts never start with '.'."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value:
        raise InvalidKey(f"invalid file name {value!r}: must be a non-empty relative POSIX path")
    for part in value.split("/"):
        _check(_FILE_PART, part, f"file name part (of {value!r})")
    return value


def object_key(value: str) -> str:
    """A full object key: relative, '/'-separated, no empty/'.'/'..'/hidden parts, bounded length."""
    if not value or len(value) > MAX_KEY_LENGTH or value.startswith("/") or "\\" in value or "\0" in value:
        raise InvalidKey(f"invalid object key {value!r}")
    for part in value.split("/"):
        if not part or part.startswith("."):
            raise InvalidKey(f"invalid object key {value!r}: empty, '.', '..' or hidden part")
    return value


def prefix(value: str) -> str:
    """A listing prefix: '' or a valid key ending with '/'."""
    if value:
        if not value.endswith("/"):
            raise InvalidKey(f"invalid prefix {value!r}: must end with '/'")
        object_key(value[:-1])
    return value


class RunLayout:
    """Keys of one run, relative to the store root: `runs/<run_id>/...`."""

    def __init__(self, run: str) -> None:
        self.run_id = run_id(run)
        self.root = f"runs/{self.run_id}/"

    @property
    def run_json(self) -> str:
        return self.root + "run.json"

    @property
    def lease(self) -> str:
        return self.root + "lease.json"

    @property
    def metrics(self) -> str:
        return self.root + "metrics.jsonl"

    @property
    def extensions_root(self) -> str:
        return self.root + "extensions/"

    def extension(self, to_updates: int) -> str:
        """The record of the extension that raised the run's updates to `to_updates`."""
        return f"{self.extensions_root}{update(to_updates):06d}.json"

    @property
    def cancellations_root(self) -> str:
        return self.root + "cancellations/"

    def cancellation(self, record_id: str) -> str:
        """The record of one cancellation of the run (by whoever stopped it: a flow run, an operator)."""
        return f"{self.cancellations_root}{record_id}.json"

    @property
    def evaluations_root(self) -> str:
        return self.root + "evaluations/"

    def evaluation(self, k: int, suite: str) -> str:
        """The evaluation of checkpoint `k` on benchmark suite `suite` (nightly or `probepo evaluate`)."""
        return f"{self.evaluations_root}{update(k):06d}/{file_name(suite)}.json"

    @property
    def evaluation_shards_root(self) -> str:
        """The progress of every unfinished evaluation of the run (`evaluation_shards`)."""
        return self.root + "evaluation-shards/"

    def evaluation_shards(self, k: int, suite: str) -> str:
        """The prefix of an evaluation's progress (checkpoint `k` on `suite`, after the fact): one object per
        engine call made, and one per job that worked on it, kept until its evaluation is committed. Beside
        the evaluations, never in the run's ledger: an evaluation after the fact takes no lease and never
        drives the run."""
        return f"{self.evaluation_shards_root}{update(k):06d}/{file_name(suite)}/"

    def evaluation_shard(self, k: int, suite: str, name: str) -> str:
        return f"{self.evaluation_shards(k, suite)}{stage(name)}.parquet"

    def evaluation_jobs(self, k: int, suite: str) -> str:
        """The prefix of the records of the scheduler's jobs that worked on an unfinished evaluation."""
        return f"{self.evaluation_shards(k, suite)}jobs/"

    def evaluation_job(self, k: int, suite: str, job: str) -> str:
        return f"{self.evaluation_jobs(k, suite)}{attempt(job)}.json"

    @property
    def ledger_root(self) -> str:
        return self.root + "ledger/"

    def ledger_dir(self, k: int) -> str:
        return f"{self.ledger_root}{update(k):06d}/"

    def marker(self, k: int, name: str) -> str:
        """The commit marker of stage `name` of update `k`."""
        return f"{self.ledger_dir(k)}{stage(name)}.json"

    @property
    def quarantine_root(self) -> str:
        return self.root + "quarantine/"

    def quarantined(self, k: int, name: str, tag: str) -> str:
        """Where an invalidated marker is kept for forensics (never deleted)."""
        return f"{self.quarantine_root}{update(k):06d}/{stage(name)}/{attempt(tag)}.json"

    @property
    def data_roots(self) -> tuple[str, str]:
        """Prefixes under which attempt folders live."""
        return self.root + "updates/", self.root + "checkpoints/"

    def attempt_dir(self, k: int, name: str, attempt_id: str) -> str:
        """The folder of one attempt's files; checkpoints sit under checkpoints/<k>/ as DESIGN.md lays out."""
        if stage(name) == Stage.CHECKPOINT:
            return f"{self.root}checkpoints/{update(k):06d}/{attempt(attempt_id)}/"
        return f"{self.root}updates/{update(k):06d}/{name}/{attempt(attempt_id)}/"

    def data_key(self, k: int, name: str, attempt_id: str, file: str) -> str:
        return self.attempt_dir(k, name, attempt_id) + file_name(file)

    @property
    def jobs_root(self) -> str:
        return self.root + "jobs/"

    def job_record(self, k: int, name: str, submission_id: str) -> str:
        return f"{self.jobs_root}{update(k):06d}/{stage(name)}/{attempt(submission_id)}.json"

    @property
    def attempts_root(self) -> str:
        return self.root + "attempts/"

    def attempt_record(self, k: int, name: str, attempt_id: str) -> str:
        return f"{self.attempts_root}{update(k):06d}/{stage(name)}/{attempt(attempt_id)}.json"

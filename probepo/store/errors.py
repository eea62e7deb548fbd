"""Errors of the artifact store: each names what failed and what to do, and never carries a credential."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises."""


class InvalidKey(StoreError, ValueError):
    """A run id, stage name, file name or object key is malformed or would escape its prefix."""


class ObjectMissing(StoreError, KeyError):
    """An object the store expected is absent (e.g. a file a commit marker names)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "object missing"


class AlreadyCommitted(StoreError):
    """Another attempt committed this stage first; its marker is the truth."""

    def __init__(self, run_id: str, update: int, stage: str, winner: dict | None) -> None:
        self.run_id, self.update, self.stage, self.winner = run_id, update, stage, winner
        attempt = (winner or {}).get("attempt", "unknown")
        super().__init__(
            f"run {run_id!r} update {update} stage {stage!r} is already committed by attempt {attempt}; "
            "read it with read_stage, or invalidate it first if it is corrupt"
        )


class NotCommitted(StoreError):
    """The stage has no commit marker: its outputs do not exist as far as readers are concerned."""

    def __init__(self, run_id: str, update: int, stage: str) -> None:
        self.run_id, self.update, self.stage = run_id, update, stage
        super().__init__(f"run {run_id!r} update {update} stage {stage!r} is not committed")


class CorruptArtifact(StoreError):
    """A committed file does not match its marker (size, sha256), is missing, or the marker is unreadable."""

    def __init__(self, run_id: str, update: int, stage: str, name: str, problem: str) -> None:
        self.run_id, self.update, self.stage, self.name, self.problem = run_id, update, stage, name, problem
        super().__init__(
            f"corrupt artifact: run {run_id!r} update {update} stage {stage!r} file {name!r}: {problem}; "
            f"recompute it: `probepo store invalidate {run_id} {update} {stage}`, "
            f"then `probepo resume {run_id}`"
        )


class EndpointLacksConditionals(StoreError):
    """The store's endpoint does not honour the conditional requests exactly-once rests on."""

    def __init__(self, where: str, lacks: list[str]) -> None:
        self.where, self.lacks = where, lacks
        super().__init__(
            f"{where} cannot hold runs: {'; '.join(lacks)}. Two attempts could both commit a stage; use an"
            " endpoint with conditional writes (AWS S3, or a gateway version that supports If-None-Match and"
            " If-Match on PUT)"
        )


class FormatError(StoreError, ValueError):
    """Bytes could not be decoded as the expected safe format (safetensors, Parquet, JSON)."""


class LeaseHeld(StoreError):
    """Another driver holds the run's lease and it has not expired."""

    def __init__(self, run_id: str, lease: dict) -> None:
        self.run_id, self.lease = run_id, lease
        super().__init__(
            f"run {run_id!r} is leased to {lease.get('holder')!r} on host {lease.get('host')!r} "
            f"(pid {lease.get('pid')}) until {lease.get('expires_at')}: another driver is working on it; "
            "wait for it to finish or for the lease to expire"
        )


class LeaseLost(StoreError):
    """Our lease was taken over (it expired, or someone forced it): stop working on the run."""


class RunNotFound(StoreError):
    """No run.json for this run id in this store."""

    def __init__(self, store_url: str, run_id: str) -> None:
        self.store_url, self.run_id = store_url, run_id
        super().__init__(f"run {run_id!r} not found in store {store_url} (no run.json)")


class RunConfigMismatch(StoreError):
    """run.json already exists with a different content."""

    def __init__(self, run_id: str, keys: list[str], advice: str | None = None) -> None:
        self.run_id, self.keys = run_id, keys
        super().__init__(
            f"run {run_id!r} already exists with a different configuration (differing: "
            f"{', '.join(keys)}); "
            + (advice or "resume it with its frozen config (`probepo resume RUN`) or choose a new run id")
        )


class StoreUnreachable(StoreError):
    """The store cannot be reached or used: endpoint down, bucket missing, credentials missing or refused."""


class StoreOutage(StoreUnreachable):
    """The endpoint does not answer, or answers with a server error (connection refused or reset, a
    timeout, 5xx after botocore's own retries): a passing state, ridden out up to the process's deadline
    (probepo/store/outage.py), then raised. Unlike a missing bucket or refused credentials, trying again
    later may succeed."""

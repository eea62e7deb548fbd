"""The artifact store: the single source of truth of a run (DESIGN.md, "The store").

`open_store(url)` gives an `ArtifactStore` over a local folder or S3; the commit protocol, ledger, lease,
metrics and gc are written once on top of a small object layer implemented by both backends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from probepo.store.errors import (
    AlreadyCommitted,
    CorruptArtifact,
    EndpointLacksConditionals,
    FormatError,
    InvalidKey,
    LeaseHeld,
    LeaseLost,
    NotCommitted,
    ObjectMissing,
    RunConfigMismatch,
    RunNotFound,
    StoreError,
    StoreOutage,
    StoreUnreachable,
)
from probepo.store.lease import Lease, acquire_lease, read_lease
from probepo.store.ledger import Ledger, ResumePoint
from probepo.store.maintenance import GcReport, VerifyReport
from probepo.store.records import AttemptOutcome, JobOutcome
from probepo.store.store import ArtifactStore, StageFiles

__all__ = [
    "AlreadyCommitted",
    "ArtifactStore",
    "AttemptOutcome",
    "CorruptArtifact",
    "EndpointLacksConditionals",
    "FormatError",
    "GcReport",
    "InvalidKey",
    "JobOutcome",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "Ledger",
    "NotCommitted",
    "ObjectMissing",
    "ResumePoint",
    "RunConfigMismatch",
    "RunNotFound",
    "StageFiles",
    "StoreError",
    "StoreOutage",
    "StoreUnreachable",
    "VerifyReport",
    "acquire_lease",
    "open_store",
    "read_lease",
]


def open_store(url: str | Path, **s3_options: Any) -> ArtifactStore:
    """Open a store: `s3://bucket/prefix` (endpoint, region, profile and credentials from the AWS settings,
    or `endpoint_url=`, `profile=`, `region=`, `max_attempts=` here), a folder path, or a `file://` URL.
    Opening contacts nothing; an S3 endpoint that ignores conditional requests is refused
    (EndpointLacksConditionals) at the store's first conditional write, before it writes anything else
    (store/capabilities.py)."""
    text = str(url)
    if text.startswith("s3://"):
        from probepo.store.s3 import S3ObjectStore

        parts = urlsplit(text)
        if not parts.netloc or parts.query or parts.fragment:
            raise InvalidKey(f"invalid S3 store URL {text!r}: expected s3://bucket[/prefix]")
        return ArtifactStore(S3ObjectStore(parts.netloc, parts.path, **s3_options))
    if s3_options:
        raise TypeError(f"options {sorted(s3_options)} apply to s3:// stores only")
    from probepo.store.local import LocalObjectStore

    if text.startswith("file://"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidKey(f"invalid file URL {text!r}: only local paths are supported")
        text = unquote(parts.path)
    elif "://" in text:
        raise InvalidKey(f"unsupported store URL {text!r}: use s3://bucket/prefix, a folder, or file://")
    return ArtifactStore(LocalObjectStore(text))

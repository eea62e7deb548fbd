"""The object layer: the few primitives the commit protocol needs, implemented once per backend.

Everything above this layer (commit markers, ledger, lease, metrics, gc) is written once against
`ObjectStore`; `LocalObjectStore` and `S3ObjectStore` only move bytes and make the create-only and
compare-and-swap writes atomic.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from probepo.store.errors import StoreError

if TYPE_CHECKING:
    from probepo.store.outage import WriteFence

COPY_BUFFER = 128 << 10
"""Bytes per read of `copy_hashed`: small enough that each piece is still in the CPU cache when it is hashed
and written. Measured on the 2-core test machine: 8 MiB reads, each a fresh allocation, took twice the CPU
per byte; one reused 1 MiB buffer copied at a third of the speed of 64-512 KiB at times."""
APPEND_RETRIES = 50


@dataclass(frozen=True)
class Digest:
    """Size and sha256 of an object's bytes."""

    size: int
    sha256: str

    @classmethod
    def of(cls, data: bytes) -> Digest:
        return cls(len(data), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: key relative to the store root, size, last-modified time (epoch seconds)."""

    key: str
    size: int
    modified: float


@dataclass(frozen=True)
class Versioned:
    """An object's bytes with the version tag (ETag) that a compare-and-swap must name."""

    data: bytes
    etag: str


class HashingWriter:
    """A write-only (non-seekable) sink that hashes bytes on their way to a file (or nowhere), in order."""

    def __init__(self, raw: BinaryIO | None) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self._size += len(data)
        return len(data) if self._raw is None else self._raw.write(data)

    def digest(self) -> Digest:
        return Digest(self._size, self._hash.hexdigest())


class UploadAbandoned(Exception):
    """An upload its caller gave up (a stop left no time for it: probepo/stages/uploads.py), ended at its
    next read of the source: the backend removes what it had written (a local temporary file, an S3
    multipart upload aborted). Not a StoreError: the store is fine."""


@dataclass
class UploadControl:
    """What the caller of an upload sees and steers of it from another thread: the bytes read so far (its
    rate), and `abandon`, which ends it at its next read (UploadAbandoned)."""

    abandon: threading.Event = field(default_factory=threading.Event)
    bytes_read: int = 0


class AbandonableReader:
    """A file read for an upload: counts what is read into its control, and raises UploadAbandoned at the
    next read once the control's `abandon` is set."""

    def __init__(self, raw: BinaryIO, control: UploadControl | None) -> None:
        self._raw, self._control = raw, control

    def _check(self) -> None:
        if self._control is not None and self._control.abandon.is_set():
            raise UploadAbandoned(f"upload of {getattr(self._raw, 'name', 'a file')} abandoned")

    def _count(self, nbytes: int) -> None:
        if self._control is not None:
            self._control.bytes_read += nbytes

    def read(self, size: int = -1) -> bytes:
        self._check()
        data = self._raw.read(size)
        self._count(len(data))
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        self._check()
        count = self._raw.readinto(buffer)
        self._count(count)
        return count


@contextlib.contextmanager
def upload_source(path: Path, control: UploadControl | None) -> Iterator[AbandonableReader]:
    """`path` opened for an upload that `control` watches and may end (see UploadAbandoned)."""
    with open(path, "rb") as raw:
        yield AbandonableReader(raw, control)


def copy_hashed(source: BinaryIO | AbandonableReader, write: Callable[[memoryview], object]) -> Digest:
    """Copy `source` from where it stands to its end through `write` in one pass, hashing each piece
    between reading and writing it; one buffer serves every piece. Returns the digest of the bytes copied."""
    buffer = bytearray(COPY_BUFFER)
    view = memoryview(buffer)
    sha, size = hashlib.sha256(), 0
    while count := source.readinto(buffer):
        piece = view[:count]
        sha.update(piece)
        write(piece)
        size += count
    return Digest(size, sha.hexdigest())


def file_digest(path: Path) -> Digest:
    """Size and sha256 of a file, streamed."""
    with open(path, "rb") as handle:
        return Digest(path.stat().st_size, hashlib.file_digest(handle, "sha256").hexdigest())


class ObjectStore(ABC):
    """Keys are relative to the store root and validated by the caller (see probepo.store.keys)."""

    url: str
    """Where the store lives, for messages: never carries a credential."""

    fence: WriteFence | None = None
    """Set while a driver holds a run's lease through this store (driver_lease.LeaseKeeper): where writes
    may wait out an outage (S3), none of the run's goes out past it until the lease is renewed
    (probepo/store/outage.py). A local folder never stops answering: it has nothing to hold back."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write (or overwrite) an object atomically: readers see the old or the new bytes, never a part."""

    @abstractmethod
    def put_file(self, key: str, path: Path, control: UploadControl | None = None) -> Digest:
        """Stream a file into an object (multipart where large) in one read of it, hashing the bytes on their
        way: the digest returned is that of the bytes stored. `control` counts the bytes read; once its
        `abandon` is set the upload ends at its next read, raising UploadAbandoned, leaving nothing."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create the object only if no object has that key: its new version tag, or None if one existed."""

    @abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace the object only if its version is `etag`: the new tag, or None if it changed/vanished."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; raises ObjectMissing."""

    @abstractmethod
    def get_versioned(self, key: str) -> Versioned | None:
        """The object's bytes and version tag, or None if absent."""

    @abstractmethod
    def download_file(self, key: str, dest: Path) -> Digest:
        """Stream the object to `dest` (parallel ranges if large), hashed in order; raises ObjectMissing."""

    @abstractmethod
    def digest(self, key: str) -> Digest:
        """Size and sha256 of the object, streamed (nothing kept in memory or on disk); ObjectMissing."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object has this key."""

    @abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (a folder-like prefix ending with '/'), recursively."""

    @abstractmethod
    def list_children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-folders of `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object if present."""

    @abstractmethod
    def delete_if_match(self, key: str, etag: str) -> bool:
        """Delete the object only if its current version is `etag`; False otherwise. Only where
        `honours_conditional_delete()`."""

    def honours_conditional_delete(self) -> bool:
        """Whether `delete_if_match` is atomic here. Where not (Ceph RGW 16 deletes whatever the version),
        callers release by a compare-and-swap write or hold the run's lease instead (capabilities.py)."""
        return True

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        """Within it, this thread's conditional requests go out as given: the capability probe's own."""
        yield

    def append(self, key: str, data: bytes) -> None:
        """Append bytes to an object, creating it if absent: a compare-and-swap loop (objects cannot grow).

        Concurrent appenders are safe; each retry rereads the object. Backends with a real append override it.
        """
        for _ in range(APPEND_RETRIES):
            current = self.get_versioned(key)
            if current is None:
                if self.put_if_absent(key, data) is not None:
                    return
            elif self.put_if_match(key, current.data + data, current.etag) is not None:
                return
        raise StoreError(f"append to {self.url}/{key} lost {APPEND_RETRIES} races in a row")

    @abstractmethod
    def prune_empty(self, prefix: str) -> None:
        """Remove empty folders left under `prefix` after deletions (only folders on disk have any)."""

"""The local-folder backend: atomic renames, exclusive creates, and fcntl locks for compare-and-swap.

Writes go to a hidden temp file in the target folder, are fsynced, then renamed into place (or hard-linked
for create-only writes, which fails if the name exists); the folder is fsynced after. Version tags are the
sha256 of the content. Names starting with '.' are this backend's own (temp and lock files) and are never
listed; keys cannot contain such parts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from probepo.store.errors import InvalidKey, ObjectMissing, StoreUnreachable
from probepo.store.keys import object_key
from probepo.store.objects import (
    Digest,
    ObjectInfo,
    ObjectStore,
    UploadControl,
    Versioned,
    copy_hashed,
    file_digest,
    upload_source,
)

WRITEBACK_EVERY = 32 << 20
_ADVISE = getattr(os, "posix_fadvise", None)  # Linux; elsewhere the fsync does all the writing


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _EarlyWriteback:
    """A sink over a file that asks the kernel to start writing each `WRITEBACK_EVERY` bytes to disk as
    soon as they are written, so the disk works while the copy goes on and the fsync before the rename
    finds little left to do. On the 2-core test machine a 765 MB file's copy and fsync took 0.86 s this
    way against 1.06 s with one fsync at the end (`cp` + `sync`: 0.80 s)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._written = self._started = 0

    def write(self, data: memoryview) -> int:
        """Write all of `data` (the handle is buffered, so it never writes part of it)."""
        count = self._handle.write(data)
        self._written += count
        if _ADVISE is not None and self._written - self._started >= WRITEBACK_EVERY:
            self._handle.flush()
            # DONTNEED starts the writeback of the range's dirty pages (and drops those already clean).
            _ADVISE(
                self._handle.fileno(), self._started, self._written - self._started, os.POSIX_FADV_DONTNEED
            )
            self._started = self._written
        return count


def _etag(data: bytes) -> str:
    """Local version tag: the content hash (so compare-and-swap needs no separate version counter)."""
    return hashlib.sha256(data).hexdigest()


class LocalObjectStore(ObjectStore):
    """Objects as files under `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)
        # Fail at open, not at the first write, where the folder can never be: under a regular file.
        existing = next(p for p in (self.root, *self.root.parents) if p.exists())
        if not existing.is_dir():
            raise StoreUnreachable(
                f"local store {self.url}: {existing} is a file, not a folder, so the store cannot live there;"
                " choose another --store (a folder, or s3://bucket/prefix)"
            )

    @contextlib.contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Turn an OS failure (permissions, a full disk, a file where a folder should be) into one store
        error naming the store, the key, the cause and what to do."""
        try:
            yield
        except (ObjectMissing, InvalidKey):
            raise
        except OSError as exc:
            raise StoreUnreachable(
                f"local store {self.url}: cannot {action} {key or '/'!r}: {exc.strerror or exc}"
                f"{f' ({exc.filename})' if exc.filename else ''}; check that the folder is writable and the"
                " disk has room, or choose another --store"
            ) from None

    def _path(self, key: str) -> Path:
        path = self.root / object_key(key)
        # A symlink planted inside the store must not lead outside it.
        if not path.resolve().is_relative_to(self.root):
            raise InvalidKey(f"key {key!r} resolves outside the store root {self.root}")
        return path

    def _temp_beside(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """An exclusive lock serialising compare-and-swap on one key (across processes on this host/NFS)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        temp = self._temp_beside(path)
        with open(temp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temp

    def _replace(self, temp: Path, path: Path) -> None:
        os.replace(temp, path)
        _fsync_dir(path.parent)

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            path = self._path(key)
            self._replace(self._write_temp(path, data), path)

    def put_file(self, key: str, path: Path, control: UploadControl | None = None) -> Digest:
        with self._errors("write", key):
            target = self._path(key)
            temp = self._temp_beside(target)
            try:
                # One read of the source: the bytes are hashed on their way into the store.
                with upload_source(path, control) as source, open(temp, "xb") as handle:
                    digest = copy_hashed(source, _EarlyWriteback(handle).write)
                    handle.flush()
                    os.fsync(handle.fileno())
                self._replace(temp, target)
            finally:
                temp.unlink(missing_ok=True)
            return digest

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        with self._errors("create", key):
            path = self._path(key)
            temp = self._write_temp(path, data)
            try:
                os.link(temp, path)  # atomic, and fails if the name exists
            except FileExistsError:
                return None
            finally:
                temp.unlink(missing_ok=True)
            _fsync_dir(path.parent)
            return _etag(data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        with self._errors("replace", key):
            path = self._path(key)
            with self._locked(path):
                current = self.get_versioned(key)
                if current is None or current.etag != etag:
                    return None
                self._replace(self._write_temp(path, data), path)
                return _etag(data)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectMissing(f"no object {key!r} in {self.url}") from None

    def get_versioned(self, key: str) -> Versioned | None:
        try:
            data = self.get_bytes(key)
        except ObjectMissing:
            return None
        return Versioned(data, _etag(data))

    def download_file(self, key: str, dest: Path) -> Digest:
        try:
            handle = open(self._path(key), "rb")  # noqa: SIM115 - closed below; opened first to map a miss
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectMissing(f"no object {key!r} in {self.url}") from None
        with handle, open(dest, "wb") as out:
            return copy_hashed(handle, out.write)

    def digest(self, key: str) -> Digest:
        try:
            return file_digest(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectMissing(f"no object {key!r} in {self.url}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._errors("list", prefix):
            top = self._path(prefix.rstrip("/")) if prefix else self.root
            for folder, subfolders, files in os.walk(top):
                subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
                for name in sorted(files):
                    if name.startswith("."):
                        continue
                    path = Path(folder, name)
                    try:
                        stat = path.stat()
                    except FileNotFoundError:  # deleted while listing
                        continue
                    yield ObjectInfo(path.relative_to(self.root).as_posix(), stat.st_size, stat.st_mtime)

    def list_children(self, prefix: str) -> list[str]:
        with self._errors("list", prefix):
            top = self._path(prefix.rstrip("/")) if prefix else self.root
            if not top.is_dir():
                return []
            return sorted(
                entry.name for entry in top.iterdir() if entry.is_dir() and not entry.name.startswith(".")
            )

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._path(key).unlink(missing_ok=True)

    def delete_if_match(self, key: str, etag: str) -> bool:
        with self._errors("delete", key):
            path = self._path(key)
            with self._locked(path):
                current = self.get_versioned(key)
                if current is None or current.etag != etag:
                    return False
                path.unlink()
                _fsync_dir(path.parent)
                return True

    def append(self, key: str, data: bytes) -> None:
        """A real append (O_APPEND + fsync) under the key's lock.

        Appended records are lines: if a crash tore the last one, a newline first keeps the new one whole.
        """
        with self._errors("append to", key):
            path = self._path(key)
            with self._locked(path):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        data = b"\n" + data
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def prune_empty(self, prefix: str) -> None:
        top = self._path(prefix.rstrip("/"))
        # Deepest first, so a folder emptied by removing its children goes too.
        for folder, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
            with contextlib.suppress(OSError):  # not empty: keep it
                Path(folder).rmdir()

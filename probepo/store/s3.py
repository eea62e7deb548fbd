"""The S3 backend (boto3): conditional writes for commit markers and leases, streamed multipart transfers.

Configuration comes from the standard AWS chain: credentials, profile (`AWS_PROFILE`), region, and the
endpoint (`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, or `endpoint_url=` for S3-compatible services).
Retries are botocore's adaptive mode; large files go up as multipart uploads read once, in order, and
hashed as read, their parts sent in parallel, and come down through s3transfer's parallel ranged downloads
hashed in order; botocore's per-part CRC32 checksums are on the wire both ways. Messages name the endpoint
and bucket, never a credential.

Every operation goes through `_call`: its failures translated (s3_errors.py) and an unreachable endpoint
ridden out (outage.py), the whole operation tried again. In a process that rides out outages, botocore
retries a request only RIDING_MAX_ATTEMPTS times (seconds), so the outage's deadline, not botocore's
backoff (~1.5 minutes over 10 attempts), says how long a request may wait.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
)
from s3transfer.utils import ChunksizeAdjuster

from probepo.store.capabilities import Conditionals, bare_etag, require_conditionals
from probepo.store.errors import ObjectMissing, StoreError, StoreUnreachable
from probepo.store.objects import (
    AbandonableReader,
    Digest,
    HashingWriter,
    ObjectInfo,
    ObjectStore,
    UploadControl,
    Versioned,
    upload_source,
)
from probepo.store.outage import RIDER
from probepo.store.s3_errors import (
    CONFLICT_CODES,
    MISSING_CODES,
    PRECONDITION_CODES,
    STREAM_ERRORS,
    error_code,
    redact_url,
    translated_errors,
    was_retried,
)

MULTIPART_THRESHOLD = 64 << 20
MULTIPART_CHUNK = 8 << 20
TRANSFER_CONCURRENCY = 10
DEFAULT_MAX_ATTEMPTS = 10
RIDING_MAX_ATTEMPTS = 2
"""botocore's retries of one request where the process rides out outages itself (outage.py)."""
CONFLICT_RETRIES = 5
_SESSION_LOCK = threading.Lock()
T = TypeVar("T")


@functools.cache
def _session(profile: str | None) -> boto3.session.Session:
    """One session per profile: creating one reloads the service models (~0.2 s), so share it."""
    return boto3.session.Session(profile_name=profile)


class S3ObjectStore(ObjectStore):
    """Objects under `s3://bucket/prefix/`."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """`max_attempts`: botocore's retries of a request; by default DEFAULT_MAX_ATTEMPTS, or
        RIDING_MAX_ATTEMPTS in a process that rides out outages."""
        self.bucket = bucket
        self.root = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.root}"
        if max_attempts is None:
            max_attempts = RIDING_MAX_ATTEMPTS if RIDER.riding else DEFAULT_MAX_ATTEMPTS
        self._max_attempts = max_attempts
        config = Config(
            retries={"mode": "adaptive", "max_attempts": max_attempts},
            connect_timeout=10,
            read_timeout=120,
            max_pool_connections=4 * TRANSFER_CONCURRENCY,
            tcp_keepalive=True,
        )
        try:
            with _SESSION_LOCK:  # sessions are not thread-safe; the clients they make are
                self.client = _session(profile).client(
                    "s3", endpoint_url=endpoint_url, region_name=region, config=config
                )
        except BotoCoreError as exc:  # e.g. an unknown profile
            raise StoreUnreachable(f"cannot configure S3 for bucket {bucket!r}: {exc}") from None
        self.endpoint = redact_url(self.client.meta.endpoint_url)
        self._conditionals_lock = threading.Lock()
        self._conditionals_verified = False
        self._conditionals = Conditionals()
        self._probing = threading.local()
        self.transfer = TransferConfig(
            multipart_threshold=MULTIPART_THRESHOLD,
            multipart_chunksize=MULTIPART_CHUNK,
            max_concurrency=TRANSFER_CONCURRENCY,
            use_threads=True,
        )

    def _errors(self, action: str, key: str) -> contextlib.AbstractContextManager[None]:
        https = self.client.meta.endpoint_url.startswith("https:")
        return translated_errors(f"S3 endpoint {self.endpoint}, bucket {self.bucket!r}", action, key, https)

    def _call(self, action: str, key: str, operation: Callable[[], T], *, writes: bool = False) -> T:
        """`operation()` (requests about `key`), its failures translated, an outage ridden out."""

        def translated() -> T:
            with self._errors(action, key):
                return operation()

        return RIDER.ride_out(translated, key=key, fence=(lambda: self.fence) if writes else None)

    def _full(self, key: str) -> str:
        return self.root + key

    # -- writes ------------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        def put() -> None:
            self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data)

        self._call("write", key, put, writes=True)

    def put_file(self, key: str, path: Path, control: UploadControl | None = None) -> Digest:
        size = path.stat().st_size
        if size < MULTIPART_THRESHOLD:
            with upload_source(path, control) as source:
                data = source.read()
            self.put_bytes(key, data)
            return Digest.of(data)
        part_size = ChunksizeAdjuster().adjust_chunksize(MULTIPART_CHUNK, size)  # at most 10,000 parts

        def upload() -> Digest:
            with upload_source(path, control) as source:
                return self._upload_parts(key, source, part_size)

        return self._call("upload", key, upload, writes=True)

    def _upload_parts(self, key: str, source: AbandonableReader, part_size: int) -> Digest:
        """A multipart upload in one pass over `source`: this thread reads the parts in order and hashes
        each as it is read, `TRANSFER_CONCURRENCY` threads send them, at most that many parts are in memory.
        So the file is read once and the digest is that of the bytes uploaded. Each part carries its CRC32
        as s3transfer's would (unless the client's checksum setting is `when_required`). The upload is
        aborted on any failure, leaving no parts behind.

        No create-only condition is needed here: the key is under a fresh attempt folder, and the commit
        marker written after it is the create-only write."""
        full = self._full(key)
        checksum = (
            {"ChecksumAlgorithm": "CRC32"}
            if self.client.meta.config.request_checksum_calculation == "when_supported"
            else {}
        )
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=full, **checksum)["UploadId"]
        slots = threading.BoundedSemaphore(TRANSFER_CONCURRENCY)
        failed = threading.Event()

        def send(number: int, data: bytes) -> dict[str, Any]:
            try:
                response = self.client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data, **checksum
                )
            except BaseException:
                failed.set()
                raise
            finally:
                slots.release()
            crc = {"ChecksumCRC32": response["ChecksumCRC32"]} if "ChecksumCRC32" in response else {}
            return {"PartNumber": number, "ETag": response["ETag"], **crc}

        sha, size, parts = hashlib.sha256(), 0, []
        try:
            with ThreadPoolExecutor(TRANSFER_CONCURRENCY) as senders:
                while not failed.is_set():
                    slots.acquire()
                    data = source.read(part_size)
                    if not data:
                        slots.release()
                        break
                    sha.update(data)
                    size += len(data)
                    parts.append(senders.submit(send, len(parts) + 1, data))
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                MultipartUpload={"Parts": [part.result() for part in parts]},
            )
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            raise
        return Digest(size, sha.hexdigest())

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        outer = getattr(self._probing, "active", False)
        self._probing.active = True
        try:
            yield
        finally:
            self._probing.active = outer

    def _verify_conditionals(self) -> Conditionals:
        """Before this store's first conditional request: refuse an endpoint that ignores them (probed once
        per store, the verdict kept in it; see capabilities.py). The dialect to send them in: as given
        for the probe's own requests."""
        if getattr(self._probing, "active", False):
            return Conditionals()
        if not self._conditionals_verified:
            with self._conditionals_lock, self.probing():  # other threads wait for the verdict
                if not self._conditionals_verified:
                    where = f"S3 endpoint {self.endpoint}, store {self.url}"
                    self._conditionals = require_conditionals(self, where)
                    self._conditionals_verified = True
        return self._conditionals

    def _if_match(self, etag: str) -> str:
        """`etag` as this endpoint compares it in If-Match (verifying the endpoint first)."""
        return bare_etag(etag) if self._verify_conditionals().bare_if_match else etag

    def _put_conditionally(self, key: str, data: bytes, **condition: str) -> str | None:
        """A conditional PUT: the new ETag, or None when the precondition fails.

        If the request was sent before (botocore retried it, or the rider tried the write again after an
        outage: a response lost after the write landed), a 412 may be our own write: the object then holds
        exactly our bytes, and that counts as success.
        """
        self._verify_conditionals()
        sent_before = False

        def put() -> str | None:
            nonlocal sent_before
            resent, sent_before = sent_before, True
            for attempt in range(CONFLICT_RETRIES):
                try:
                    response = self.client.put_object(
                        Bucket=self.bucket, Key=self._full(key), Body=data, **condition
                    )
                    return response["ETag"]
                except ClientError as exc:
                    code = error_code(exc)
                    if code in PRECONDITION_CODES:
                        if resent or was_retried(exc):
                            current = self.get_versioned(key)
                            return current.etag if current is not None and current.data == data else None
                        return None
                    if code not in CONFLICT_CODES:
                        raise
                # 409: a concurrent conditional write on the key was in flight; S3 asks us to retry.
                time.sleep(0.05 * 2**attempt)
            raise StoreError(
                f"{self.url}{key}: {CONFLICT_RETRIES} conditional writes in a row met a conflict (409)"
            )

        return self._call("write", key, put, writes=True)

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        return self._put_conditionally(key, data, IfNoneMatch="*")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        return self._put_conditionally(key, data, IfMatch=self._if_match(etag))

    # -- reads -------------------------------------------------------------------------------------

    def _get(self, key: str) -> tuple[bytes, str] | None:
        def get() -> tuple[bytes, str] | None:
            attempt = 0
            while True:
                try:
                    response: dict[str, Any] = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
                except ClientError as exc:
                    if error_code(exc) in MISSING_CODES:
                        return None
                    raise
                try:
                    return response["Body"].read(), response["ETag"]
                except STREAM_ERRORS:  # a body cut off: botocore's retries do not cover the read
                    attempt += 1
                    if attempt == self._max_attempts:
                        raise
                time.sleep(min(0.1 * 2**attempt, 5.0))

        return self._call("read", key, get)

    def get_bytes(self, key: str) -> bytes:
        found = self._get(key)
        if found is None:
            raise ObjectMissing(f"no object {key!r} in {self.url}")
        return found[0]

    def get_versioned(self, key: str) -> Versioned | None:
        found = self._get(key)
        return None if found is None else Versioned(*found)

    def download_file(self, key: str, dest: Path) -> Digest:
        def download() -> Digest:
            with open(dest, "wb") as handle:  # a try after an outage starts the file over
                return self._stream(key, HashingWriter(handle))

        return self._call("download", key, download)

    def digest(self, key: str) -> Digest:
        return self._call("read", key, lambda: self._stream(key, HashingWriter(None)))

    def _stream(self, key: str, sink: HashingWriter) -> Digest:
        """Download into a hashing sink. Being write-only, it makes s3transfer deliver the parallel ranges
        in order, so the bytes are hashed in one pass."""
        try:
            self.client.download_fileobj(self.bucket, self._full(key), sink, Config=self.transfer)
        except ClientError as exc:
            if error_code(exc) in MISSING_CODES:
                raise ObjectMissing(f"no object {key!r} in {self.url}") from None
            raise
        return sink.digest()

    def exists(self, key: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self._full(key))
                return True
            except ClientError as exc:
                if error_code(exc) in MISSING_CODES:
                    return False
                raise

        return self._call("check", key, head)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Listed whole before the first is yielded: a listing cut by an outage is started over."""

        def listed() -> list[ObjectInfo]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._full(prefix)
            )
            return [
                ObjectInfo(item["Key"][len(self.root) :], int(item["Size"]), item["LastModified"].timestamp())
                for page in pages
                for item in page.get("Contents", [])
            ]

        return iter(self._call("list", prefix, listed))

    def list_children(self, prefix: str) -> list[str]:
        full = self._full(prefix)

        def listed() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full, Delimiter="/"
            )
            return sorted(
                item["Prefix"][len(full) :].rstrip("/")
                for page in pages
                for item in page.get("CommonPrefixes", [])
            )

        return self._call("list", prefix, listed)

    # -- deletes -----------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        def delete() -> None:
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

        self._call("delete", key, delete, writes=True)

    def honours_conditional_delete(self) -> bool:
        return self._verify_conditionals().conditional_delete

    def delete_if_match(self, key: str, etag: str) -> bool:
        if not self.honours_conditional_delete():  # it would delete whatever the version
            raise StoreError(
                f"S3 endpoint {self.endpoint} ignores If-Match on DELETE: {key!r} cannot be deleted "
                "conditionally (callers check honours_conditional_delete first)"
            )
        if_match = self._if_match(etag)

        def delete() -> bool:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self._full(key), IfMatch=if_match)
                return True
            except ClientError as exc:
                if error_code(exc) in PRECONDITION_CODES | MISSING_CODES:
                    return False
                raise

        return self._call("delete", key, delete, writes=True)

    def prune_empty(self, prefix: str) -> None:
        """Nothing to do: S3 has no folders, only keys."""

"""Whether an object store honours the conditional requests that exactly-once rests on: a read after a
write that sees the write, a PUT with the current ETag in `If-Match` accepted, a create-only PUT
(`If-None-Match: *`) refused on an existing key, a PUT with a stale `If-Match` refused. An S3 endpoint that
ignores them would let two attempts both commit a stage, or two drivers both hold a lease, silently: the
store refuses it.

Two dialects are found and worked around with the same guarantees (both measured on Ceph RGW 16.2):
- `If-Match` compared with the bare ETag: RGW 16 refuses the quoted ETag that AWS documents and boto3
  returns, and honours the same value without its quotes, atomically. The store then sends it bare.
- A DELETE that ignores `If-Match` (RGW 16 deletes whatever the version): `delete_if_match` is then never
  sent; a lease is released by a compare-and-swap write of a released record instead (lease.py), and
  `invalidate` checks and deletes a marker while holding the run's lease (maintenance.py).

An S3 store runs the probe before its first conditional request (opening a store contacts nothing), once
per store: the verdict, with the dialect found, is kept in it, so later processes read one small object.

The probe is sequential: it cannot see an endpoint whose check-then-write is not atomic under concurrency
(two conditional PUTs racing on one key, both passing the check). moto's server is such an endpoint
(tests/s3server.py serialises its conditional requests); AWS S3 documents the atomic behaviour, and the
store's racing-writer tests pass on Ceph RGW 16.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import asdict, dataclass

from probepo.store.errors import EndpointLacksConditionals, FormatError
from probepo.store.formats import from_json_bytes, to_json_bytes
from probepo.store.keys import utc_now
from probepo.store.objects import ObjectStore

VERDICT = "capabilities/conditional-requests.json"
"""Written create-only once the probe passed: later opens of the store read it instead of probing."""
PROBE_PREFIX = "capabilities/probe-"
STALE_ETAG = '"00000000000000000000000000000000"'


@dataclass(frozen=True)
class Conditionals:
    """How an endpoint honours conditional requests (the defaults: as AWS S3 documents)."""

    bare_if_match: bool = False
    """`If-Match` must carry the ETag without its quotes (Ceph RGW 16)."""
    conditional_delete: bool = True
    """A DELETE with a stale `If-Match` is refused (not so on Ceph RGW 16)."""

    @classmethod
    def from_verdict(cls, data: bytes) -> Conditionals:
        """The dialect a verdict records; a verdict written before dialects were probed passed the
        quoted If-Match and conditional DELETE checks, so it gets the defaults."""
        record = from_json_bytes(data)
        return cls(
            bare_if_match=record.get("bare_if_match", False) is True,
            conditional_delete=record.get("conditional_delete", True) is not False,
        )

    def workarounds(self) -> list[str]:
        """What the store does differently on this endpoint, one phrase each ([]: nothing)."""
        notes = ["If-Match sent with bare ETags"] if self.bare_if_match else []
        if not self.conditional_delete:
            notes.append("no conditional DELETE: leases released by compare-and-swap writes")
        return notes


def bare_etag(etag: str) -> str:
    """The ETag without its surrounding quotes."""
    return etag.strip('"')


def probe_conditionals(objects: ObjectStore) -> tuple[Conditionals, list[str]]:
    """Probe the store afresh (its requests sent as given, see ObjectStore.probing): the dialect found,
    and what it lacks of the checks above, one phrase each ([]: it honours them all)."""
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    lacks: list[str] = []
    bare = False
    with objects.probing():
        try:
            if objects.put_if_absent(key, b"first") is None:
                return Conditionals(), [
                    f"a create-only PUT (If-None-Match: *) of the new key {key} was refused"
                ]
            written = objects.get_versioned(key)
            if written is None or written.data != b"first":
                lacks.append("a read right after a write did not return the written bytes")
            # New bytes: a retried PUT met by 412 counts as ours only if the object holds exactly its bytes
            elif objects.put_if_match(key, b"matched", written.etag) is None:
                bare = written.etag != bare_etag(written.etag) and (
                    objects.put_if_match(key, b"matched", bare_etag(written.etag)) is not None
                )
                if not bare:
                    lacks.append("a PUT with the current ETag in If-Match was refused")
            stale = bare_etag(STALE_ETAG) if bare else STALE_ETAG
            if objects.put_if_absent(key, b"second") is not None:
                lacks.append("a create-only PUT (If-None-Match: *) of an existing key was not refused")
            if objects.put_if_match(key, b"third", stale) is not None:
                lacks.append("a PUT with a stale If-Match was not refused")
            conditional_delete = not objects.delete_if_match(key, stale) and objects.exists(key)
        finally:
            objects.delete(key)
    return Conditionals(bare_if_match=bare, conditional_delete=conditional_delete), lacks


def require_conditionals(objects: ObjectStore, where: str) -> Conditionals:
    """The dialect of a store whose endpoint honours conditional requests; refuses another
    (EndpointLacksConditionals, naming `where` and what it lacks). Probes once per store and records the
    verdict in it."""
    recorded = objects.get_versioned(VERDICT)
    if recorded is not None:
        try:
            return Conditionals.from_verdict(recorded.data)
        except (FormatError, AttributeError):  # garbled: probe again (the record stays as it is)
            pass
    found, lacks = probe_conditionals(objects)
    if lacks:
        raise EndpointLacksConditionals(where, lacks)
    record = {"checked_at": utc_now(), "host": socket.gethostname(), "pid": os.getpid(), **asdict(found)}
    objects.put_if_absent(VERDICT, to_json_bytes(record))  # another process may have written it first
    return found

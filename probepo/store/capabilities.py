"""Whether an object store honours the conditional requests that exactly-once rests on: a read after a
write that sees the write, a PUT with the current ETag in `If-Match` accepted, a create-only PUT
(`If-None-Match: *`) refused on an existing key, a PUT and a DELETE with a stale `If-Match` refused. An
S3 endpoint that ignores them would let two attempts both commit a stage, or two drivers both hold a
lease, silently.

An S3 store runs the probe before its first conditional request (opening a store contacts nothing), once
per store: the verdict is kept in it, so later processes read one small object instead.

The probe is sequential: it cannot see an endpoint whose check-then-write is not atomic under concurrency
(two conditional PUTs racing on one key, both passing the check). moto's server is such an endpoint
(tests/s3server.py serialises its conditional requests); AWS S3 documents the atomic behaviour.
"""

from __future__ import annotations

import os
import socket
import uuid

from probepo.store.errors import EndpointLacksConditionals
from probepo.store.formats import to_json_bytes
from probepo.store.keys import utc_now
from probepo.store.objects import ObjectStore

VERDICT = "capabilities/conditional-requests.json"
"""Written create-only once the probe passed: later opens of the store read it instead of probing."""
PROBE_PREFIX = "capabilities/probe-"
STALE_ETAG = '"00000000000000000000000000000000"'


def missing_conditionals(objects: ObjectStore) -> list[str]:
    """What the store fails of the four checks above, one phrase each ([]: it honours them all)."""
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    lacks = []
    try:
        if objects.put_if_absent(key, b"first") is None:
            return [f"a create-only PUT (If-None-Match: *) of the new key {key} was refused"]
        written = objects.get_versioned(key)
        if written is None or written.data != b"first":
            lacks.append("a read right after a write did not return the written bytes")
        elif objects.put_if_match(key, b"first", written.etag) is None:
            lacks.append("a PUT with the current ETag in If-Match was refused")
        if objects.put_if_absent(key, b"second") is not None:
            lacks.append("a create-only PUT (If-None-Match: *) of an existing key was not refused")
        if objects.put_if_match(key, b"third", STALE_ETAG) is not None:
            lacks.append("a PUT with a stale If-Match was not refused")
        if objects.delete_if_match(key, STALE_ETAG) or not objects.exists(key):
            lacks.append("a DELETE with a stale If-Match was not refused")
    finally:
        objects.delete(key)
    return lacks


def require_conditionals(objects: ObjectStore, where: str) -> None:
    """Refuse (EndpointLacksConditionals, naming `where` and what it lacks) a store whose endpoint does
    not honour conditional requests; probes once per store and records the verdict in it."""
    if objects.exists(VERDICT):
        return
    lacks = missing_conditionals(objects)
    if lacks:
        raise EndpointLacksConditionals(where, lacks)
    record = {"checked_at": utc_now(), "host": socket.gethostname(), "pid": os.getpid()}
    objects.put_if_absent(VERDICT, to_json_bytes(record))  # another process may have written it first

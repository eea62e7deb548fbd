"""Fault injection for a boto3 S3 client through botocore's event hooks (no mock of S3 itself).

`before-send` handlers may return a response instead of sending (an injected 503/500) or raise (a reset
connection); botocore's retry logic then treats them exactly like faults from the network.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, ResponseStreamingError
from botocore.httpsession import URLLib3Session

ERROR_BODIES = {
    503: b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    500: b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>",
}


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


@dataclass
class FaultInjector:
    """Fails every `period`-th matching request with the next fault of `faults` ('503', '500', 'reset',
    'lost'); requests match by operation name and URL substring; at most `limit` faults if set."""

    faults: list[str]
    period: int = 2
    operations: tuple[str, ...] = ()
    url_contains: str = ""
    limit: int | None = None
    injected: list[tuple[str, str]] = field(default_factory=list)
    _count: Iterator[int] = field(default_factory=itertools.count)
    _cycle: Iterator[str] | None = None

    def install(self, client: Any) -> FaultInjector:
        self._cycle = itertools.cycle(self.faults)
        client.meta.events.register("before-send.s3", self._before_send)
        return self

    def _before_send(self, request: Any, event_name: str, **_: Any) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        if (self.operations and operation not in self.operations) or self.url_contains not in request.url:
            return None
        if self.limit is not None and len(self.injected) >= self.limit:
            return None
        if next(self._count) % self.period:
            return None
        assert self._cycle is not None
        fault = next(self._cycle)
        self.injected.append((operation, fault))
        if fault == "reset":
            raise ConnectionClosedError(endpoint_url=request.url)
        if fault == "lost":  # the request lands on the server, its response never arrives
            URLLib3Session().send(request)
            raise ConnectionClosedError(endpoint_url=request.url)
        status = int(fault)
        return AWSResponse(
            request.url, status, {"Content-Type": "application/xml"}, _RawBody(ERROR_BODIES[status])
        )


class _BrokenBody:
    """A GetObject body whose connection drops mid-stream on read."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def read(self, *_: Any) -> bytes:
        self._body.read(5)
        self._body.close()
        raise ResponseStreamingError(error="Connection broken: ConnectionResetError(104, 'Connection reset')")


@dataclass
class BodyBreaker:
    """Breaks the body of the first `count` GetObject responses mid-stream."""

    count: int
    broken: int = 0

    def install(self, client: Any) -> BodyBreaker:
        client.meta.events.register("after-call.s3.GetObject", self._after_call)
        return self

    def _after_call(self, parsed: dict[str, Any], **_: Any) -> None:
        if self.broken < self.count and "Body" in parsed:
            self.broken += 1
            parsed["Body"] = _BrokenBody(parsed["Body"])

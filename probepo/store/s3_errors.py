"""How the S3 backend reads botocore's failures: the error codes it tells apart, and the translation of
every failure into a store error that names endpoint, bucket and key (never a credential). An endpoint
that does not answer (connection refused or reset, a timeout, a body cut off, 5xx once botocore's own
retries are spent) becomes StoreOutage, which the rider waits out (outage.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from s3transfer.exceptions import RetriesExceededError

from probepo.store.errors import StoreError, StoreOutage, StoreUnreachable

# A body cut off mid-stream is not covered by botocore's request retries: we retry those reads ourselves.
STREAM_ERRORS = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, ConnectionClosedError)
CREDENTIAL_ERRORS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)
UNCONNECTED_ERRORS = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ProxyConnectionError,
    ConnectionClosedError,
)
"""No connection, or one closed under the request: the endpoint is down or restarting."""
CUT_OFF_ERRORS = (HTTPClientError, IncompleteReadError, RetriesExceededError)
"""A read timeout, a body cut off mid-stream (s3transfer's ranged downloads, after their own retries)."""
REFUSED_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
PRECONDITION_CODES = {"PreconditionFailed", "412"}
CONFLICT_CODES = {"ConditionalRequestConflict", "409"}


def redact_url(url: str | None) -> str:
    """The URL without any user:password part, for messages."""
    if not url:
        return "<default AWS endpoint>"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def server_error(error: ClientError) -> bool:
    """A 5xx: the endpoint is there but cannot serve (overloaded, restarting, a proxy without backend)."""
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)) >= 500


def was_retried(error: ClientError) -> bool:
    return int(error.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0


@contextlib.contextmanager
def translated_errors(where: str, action: str, key: str, https: bool) -> Iterator[None]:
    """Turn botocore failures into store errors that name `where` (endpoint and bucket) and the key."""
    try:
        yield
    except CREDENTIAL_ERRORS:
        raise StoreUnreachable(
            f"{where}: no usable AWS credentials; set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY (or an instance role)"
        ) from None
    except UNCONNECTED_ERRORS as exc:
        raise StoreOutage(
            f"{where}: cannot connect ({type(exc).__name__}) while trying to {action} {key!r}; "
            "check that the endpoint is up and that AWS_ENDPOINT_URL_S3 (or the profile endpoint_url) "
            "points at it"
        ) from None
    except ClientError as exc:
        code = error_code(exc)
        if code == "NoSuchBucket":
            raise StoreUnreachable(f"{where}: the bucket does not exist; create it or fix the URL") from None
        if code in REFUSED_CODES:
            raise StoreUnreachable(
                f"{where}: request refused ({code}) while trying to {action} {key!r}; check the "
                "credentials, profile and bucket policy"
            ) from None
        if code == "MissingContentLength" and https:
            # botocore's default over HTTPS: the body aws-chunked with a trailing checksum (Ceph RGW 16)
            raise StoreError(
                f"{where}: the endpoint refused a streamed upload with a trailing checksum while trying "
                f"to {action} {key!r}; set AWS_REQUEST_CHECKSUM_CALCULATION=when_required (or "
                "request_checksum_calculation = when_required in the AWS profile)"
            ) from None
        failed = StoreOutage if server_error(exc) else StoreError
        raise failed(f"{where}: {action} {key!r} failed: {exc}") from exc
    except CUT_OFF_ERRORS as exc:
        raise StoreOutage(f"{where}: {action} {key!r} failed: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"{where}: {action} {key!r} failed: {exc}") from exc

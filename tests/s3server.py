"""A real S3-compatible endpoint on loopback for tests and benchmarks: moto's server in a child process.

`start_s3_server()` launches `python tests/s3server.py --port N` and waits until it answers; the server lives
outside the test process, so tests may SIGKILL writers (or the test process itself) without losing it.

moto checks `If-None-Match: *` / `If-Match` and then stores the object in two separate steps, and its
werkzeug server is threaded, so two concurrent conditional PUTs of the same key can both pass the check.
Real S3 makes the check and the write one atomic step. `--atomic-conditionals` (the default) restores
that guarantee by serialising the requests that carry a precondition (and deletes); plain uploads stay
concurrent, so throughput measurements are unaffected.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key-never-printed",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """Return a TCP port on loopback that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SerialiseConditionalWrites:
    """WSGI middleware: one request with a precondition (or a DELETE) at a time, as S3 makes them atomic."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        conditional = (
            "HTTP_IF_NONE_MATCH" in environ
            or "HTTP_IF_MATCH" in environ
            or environ.get("REQUEST_METHOD") == "DELETE"
        )
        if not conditional:
            return self._app(environ, start_response)
        with self._lock:
            # Materialise the body inside the lock so the write completes before the next check.
            return list(self._app(environ, start_response))


class IgnoreConditionals:
    """WSGI middleware: the precondition headers dropped from every request, as an endpoint that does not
    implement them would (what the store's capability probe must refuse)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        for header in ("HTTP_IF_NONE_MATCH", "HTTP_IF_MATCH"):
            environ.pop(header, None)
        return self._app(environ, start_response)


def serve(port: int, *, atomic_conditionals: bool, ignore_conditionals: bool = False) -> None:
    """Run moto's S3 server on 127.0.0.1:port until killed."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app: Any = DomainDispatcherApplication(create_backend_app)
    if atomic_conditionals:
        app = SerialiseConditionalWrites(app)
    if ignore_conditionals:
        app = IgnoreConditionals(app)
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    server.serve_forever()


@dataclass
class S3Server:
    """A running moto server process and how to reach it."""

    process: subprocess.Popen[bytes] | None
    """None for a server this process did not start (infra/s3/start.sh's): stopping it is not ours."""
    port: int
    endpoint_url: str
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        """Terminate the server process (if this process started it) and wait for it."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_s3_server(
    *, atomic_conditionals: bool = True, ignore_conditionals: bool = False, timeout_s: float = 30.0
) -> S3Server:
    """Start a moto S3 server on a free loopback port and wait until it answers HTTP (`ignore_conditionals`:
    one that drops If-None-Match and If-Match, as an endpoint without them would)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port)]
    if not atomic_conditionals:
        cmd.append("--plain")
    if ignore_conditionals:
        cmd.append("--ignore-conditionals")
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with code {process.returncode} before answering")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto server on {endpoint} did not answer within {timeout_s} s") from None
            time.sleep(0.05)
    env = {**TEST_CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint}
    return S3Server(process=process, port=port, endpoint_url=endpoint, env=env)


def running_s3_server(endpoint: str, credentials: dict[str, str] = TEST_CREDENTIALS) -> S3Server:
    """The S3 server already answering at `endpoint` (started by infra/s3/start.sh, or Ceph's gateway by
    infra/s3/ceph/start.sh with its own `credentials`)."""
    port = int(endpoint.rsplit(":", 1)[1])
    return S3Server(
        process=None,
        port=port,
        endpoint_url=endpoint,
        env={**credentials, "AWS_ENDPOINT_URL_S3": endpoint},
    )


def isolated_aws_env(server: S3Server) -> dict[str, str]:
    """Environment variables that point boto3 at `server` and away from any real AWS configuration."""
    return {
        **server.env,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--plain", action="store_true", help="moto as shipped: conditional writes not atomic")
    parser.add_argument("--ignore-conditionals", action="store_true", help="drop If-None-Match and If-Match")
    args = parser.parse_args()
    serve(args.port, atomic_conditionals=not args.plain, ignore_conditionals=args.ignore_conditionals)

"""A TCP link in front of an S3 endpoint that a test can cut and restore: an outage as the store's client
sees one (new connections refused, open ones reset), the server and its objects untouched. Moto keeps
nothing across a restart of its own, so this is how a store test takes its endpoint away for a while; the
drills stop Ceph's real gateway instead (infra/s3/ceph/gateway.sh)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from urllib.parse import urlsplit

from tests.s3server import free_port

ACCEPT_POLL_S = 0.05


class CuttableLink:
    """Forwards 127.0.0.1:`port` to `endpoint_url` while up."""

    def __init__(self, endpoint_url: str) -> None:
        target = urlsplit(endpoint_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._listening = threading.Event()
        self._acceptor: threading.Thread | None = None
        self.up()

    def up(self) -> None:
        """Accept connections again, on the same port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_S)
        self._listening.set()
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones (a gateway gone); returns once it is so."""
        self._listening.clear()
        if self._acceptor is not None:
            self._acceptor.join()
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):  # closed already by its pump
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    connection.close()
            self._connections.clear()

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while self._listening.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                upstream = socket.create_connection(self._target)
                with self._lock:
                    self._connections.update((client, upstream))
                for source, sink in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):  # the other pump shut it already
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

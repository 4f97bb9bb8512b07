"""A real HTTP server on 127.0.0.1 (ephemeral port) served from a daemon thread: the base of the
fake AWS endpoints and the fake Kubernetes API."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer


class ServerThread:
    def __init__(self, server: ThreadingHTTPServer, name: str) -> None:
        server.daemon_threads = True
        self.server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

"""A Kubernetes API server for the gate's few calls, on 127.0.0.1 in a thread: GET and JSON-patch PATCH of nodes
(`test` and `add` operations, resourceVersion bumped on every change, 409 on a stale test as the API server answers a
failed precondition), POST of core/v1 Events (generateName honoured). Every request is recorded with its
Authorization header."""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.trainctl.loopback import ServerThread


@dataclass
class Recorded:
    method: str
    path: str
    authorization: str | None
    content_type: str | None
    body: Any


@dataclass
class FakeApiServer:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Other objects GET serves, by path (e.g. /apis/ray.io/v1/namespaces/ray/rayjobs/NAME)."""
    requests: list[Recorded] = field(default_factory=list)
    conflicts: int = 0
    """How many PATCHes to answer 409 before applying (a concurrent writer)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: ServerThread | None = None

    def add_node(self, name: str, taints: list[dict[str, str]] | None = None) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": f"uid-of-{name}",
                "resourceVersion": "1",
                "labels": {"kubernetes.io/hostname": name},
            },
            "spec": {"taints": list(taints)} if taints else {},
        }

    def start(self) -> FakeApiServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _record(self, body: Any) -> None:
                with fake._lock:
                    fake.requests.append(
                        Recorded(
                            self.command,
                            self.path,
                            self.headers.get("Authorization"),
                            self.headers.get("Content-Type"),
                            body,
                        )
                    )

            def do_GET(self) -> None:
                self._record(None)
                name = self.path.removeprefix("/api/v1/nodes/")
                if self.path.startswith("/api/v1/nodes/") and name in fake.nodes:
                    self._reply(200, fake.nodes[name])
                elif self.path in fake.objects:
                    self._reply(200, fake.objects[self.path])
                else:
                    self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

            def do_PATCH(self) -> None:
                body = self._body()
                self._record(body)
                name = self.path.removeprefix("/api/v1/nodes/")
                if name not in fake.nodes:
                    self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                    return
                if self.headers.get("Content-Type") != "application/json-patch+json":
                    self._reply(415, {"kind": "Status", "code": 415, "reason": "UnsupportedMediaType"})
                    return
                with fake._lock:
                    if fake.conflicts:
                        fake.conflicts -= 1
                        node = fake.nodes[name]
                        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    node = copy.deepcopy(fake.nodes[name])
                    for op in body:
                        parts = op["path"].strip("/").split("/")
                        target = node
                        for part in parts[:-1]:
                            target = target.setdefault(part, {})
                        if op["op"] == "test":
                            if target.get(parts[-1]) != op["value"]:
                                self._reply(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                                return
                        elif op["op"] in ("add", "replace"):
                            target[parts[-1]] = op["value"]
                        else:
                            self._reply(422, {"kind": "Status", "code": 422, "reason": "Invalid"})
                            return
                    node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                    fake.nodes[name] = node
                self._reply(200, node)

            def do_POST(self) -> None:
                body = self._body()
                self._record(body)
                parts = self.path.strip("/").split("/")
                if len(parts) != 5 or parts[:2] != ["api", "v1"] or parts[4] != "events":
                    self._reply(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                    return
                with fake._lock:
                    event = dict(body)
                    event["metadata"] = {**body["metadata"], "name": body["metadata"]["generateName"] + "x1"}
                    fake.events.append(event)
                self._reply(201, event)

        self._thread = ServerThread(ThreadingHTTPServer(("127.0.0.1", 0), Handler), "fake-apiserver")
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._thread is not None
        return self._thread.url

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()

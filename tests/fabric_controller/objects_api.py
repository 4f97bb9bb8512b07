"""A loopback HTTP server holding Kubernetes objects by path, for the controller and the gate's client (the real
urllib client speaks to it): GET an object or a list (labelSelector k=v, fieldSelector on an Event's reason and
involvedObject.uid, as core/v1 Events select), POST an Event (generateName), PATCH a JSON patch (add, test) or a
merge patch with metadata.resourceVersion as the precondition (409 on a stale one, as the API server answers).
Every request is recorded. Objects of a list path are every object whose path is one segment below it."""

from __future__ import annotations

import copy
import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.trainctl.loopback import ServerThread


@dataclass
class ObjectsApi:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(100))

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        self.objects[path] = obj
        return obj

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        found = [o for p, o in sorted(self.objects.items()) if "/events/" in p]
        return [e for e in found if reason is None or e.get("reason") == reason]

    def _list(self, path: str, query: dict[str, list[str]]) -> dict[str, Any]:
        items = [o for p, o in sorted(self.objects.items()) if p.rpartition("/")[0] == path]
        for selector in (query.get("labelSelector") or [""])[0].split(","):
            if selector:
                key, _, value = selector.partition("=")
                items = [o for o in items if (o["metadata"].get("labels") or {}).get(key) == value]
        for selector in (query.get("fieldSelector") or [""])[0].split(","):
            if selector:
                key, _, value = selector.partition("=")
                if key == "reason":
                    items = [o for o in items if o.get("reason") == value]
                elif key == "involvedObject.uid":
                    items = [o for o in items if (o.get("involvedObject") or {}).get("uid") == value]
                else:
                    raise ValueError(f"fieldSelector {key} is not served")
        return {"kind": "List", "items": copy.deepcopy(items)}

    def handle(self, method: str, raw: str, content_type: str, body: Any) -> tuple[int, Any]:
        parsed = urllib.parse.urlparse(raw)
        path, query = parsed.path, urllib.parse.parse_qs(parsed.query)
        with self._lock:
            self.requests.append((method, raw))
            if method == "GET":
                if path in self.objects:
                    return 200, copy.deepcopy(self.objects[path])
                if any(p.rpartition("/")[0] == path for p in self.objects) or path.endswith(("s", "events")):
                    return 200, self._list(path, query)
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            if method == "POST" and path.endswith("/events"):
                name = body["metadata"].get("name") or f"{body['metadata']['generateName']}{next(self._names)}"
                body["metadata"]["name"] = name
                return 201, self.put(f"{path}/{name}", body)
            if method == "PATCH" and path in self.objects:
                current = self.objects[path]
                if content_type == "application/json-patch+json":
                    patched = copy.deepcopy(current)
                    for op in body:
                        key = op["path"].strip("/").split("/")
                        if op["op"] == "test":
                            if current["metadata"]["resourceVersion"] != op["value"]:
                                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                        elif op["op"] == "add":
                            patched.setdefault(key[0], {})[key[1]] = op["value"]
                    return 200, self.put(path, patched)
                if content_type == "application/merge-patch+json":
                    wanted = (body.get("metadata") or {}).get("resourceVersion")
                    if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                        return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                    return 200, self.put(path, _merge(current, body))
            return 501, {"kind": "Status", "code": 501, "message": f"{method} {path} not served"}


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


@contextmanager
def serving(api: ObjectsApi) -> Iterator[ObjectsApi]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, reply = api.handle(self.command, self.path, self.headers.get("Content-Type", ""), body)
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve  # noqa: N815

    loop = ServerThread(ThreadingHTTPServer(("127.0.0.1", 0), Handler), "objects-api")
    loop.start()
    api.url = loop.url
    try:
        yield api
    finally:
        loop.stop()

"""ClusterKube that also serves Kueue ClusterQueues, the loopback Kubernetes API `trainctl scale` and
`trainctl status` move and read a group's quota on.

Served besides ClusterKube's nodes and pods: `GET /apis/kueue.x-k8s.io/v1beta2/clusterqueues` (with a label
selector) and `GET` and `PATCH /apis/kueue.x-k8s.io/v1beta2/clusterqueues/NAME`; `GET` of the ConfigMaps in
`config_maps`.
A PATCH is a JSON merge patch (RFC 7386; the API server's only patch type for a custom resource besides JSON
patch and apply: 415 for any other Content-Type); the patched object must still match the vendored Kueue CRD
(gates/manifests.py, as the API server's schema validation would: 422 otherwise). Each patch is recorded with
what `on_patch()` returns at that moment, so a test can tell what had happened elsewhere (e.g. in moto) when
the quota changed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gates.manifests import check_objects
from tests.trainctl.fake_kube import ClusterKube, Recorded, _ClusterHandler, matches, status_object

PREFIX = ["apis", "kueue.x-k8s.io", "v1beta2", "clusterqueues"]
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Patch:
    name: str
    body: dict[str, Any]
    seen: Any
    """What on_patch() returned when the patch arrived."""
    node_polls: int


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def gpu_nominal(queue: dict[str, Any], flavor: str, resource: str = "nvidia.com/gpu") -> str:
    for group in queue["spec"]["resourceGroups"]:
        for entry in group["flavors"]:
            if entry["name"] == flavor:
                return next(str(r["nominalQuota"]) for r in entry["resources"] if r["name"] == resource)
    raise KeyError(flavor)


class QueueKube(ClusterKube):
    def __init__(
        self,
        script: Callable[[int], tuple[list[dict[str, Any]], list[dict[str, Any]]]],
        queues: list[dict[str, Any]],
        *,
        on_patch: Callable[[], Any] = lambda: None,
    ) -> None:
        super().__init__(script)
        # Validated here too: the schemas load once (seconds), not inside a request the client times out on.
        assert check_objects([(f"queue/{q['metadata']['name']}", q) for q in queues]) == []
        self.queues = {q["metadata"]["name"]: copy.deepcopy(q) for q in queues}
        self.on_patch = on_patch
        self.patches: list[Patch] = []
        # GET /api/v1/namespaces/NS/configmaps/NAME -> the object (the hold controller's config, for status).
        self.config_maps: dict[str, dict[str, Any]] = {}
        self._loop.server.RequestHandlerClass = _QueueHandler


class _QueueHandler(_ClusterHandler):
    @property
    def kube(self) -> QueueKube:
        fake = self.fake
        assert isinstance(fake, QueueKube)
        return fake

    def _queue_name(self) -> str | None:
        parts = urlsplit(self.path).path.strip("/").split("/")
        return parts[4] if parts[:4] == PREFIX and len(parts) == 5 else None

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        name = self._queue_name()
        if url.path.strip("/").split("/") == PREFIX:
            return self._list(parse_qs(url.query).get("labelSelector", [""])[0])
        if name is None and url.path in self.kube.config_maps:
            return self._json(200, copy.deepcopy(self.kube.config_maps[url.path]))
        if name is None:
            return super().do_GET()
        kube = self.kube
        kube.record(Recorded("GET", url.path, {}, self.headers.get("Authorization")))
        with kube._lock:
            queue = copy.deepcopy(kube.queues.get(name))
        if queue is None:
            return self._json(404, status_object(404, "NotFound", f'clusterqueues.kueue.x-k8s.io "{name}" not found'))
        self._json(200, queue)

    def _list(self, selector: str) -> None:
        kube = self.kube
        kube.record(Recorded("GET", "/" + "/".join(PREFIX), {"labelSelector": [selector]}, None))
        with kube._lock:
            items = [copy.deepcopy(q) for q in kube.queues.values() if matches(q["metadata"]["labels"], selector)]
        document = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueueList", "items": items}
        self._json(200, {**document, "metadata": {"resourceVersion": "1"}})

    def do_PATCH(self) -> None:  # noqa: N802 (http.server's name)
        kube = self.kube
        name = self._queue_name()
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        kube.record(Recorded("PATCH", urlsplit(self.path).path, {}, self.headers.get("Authorization")))
        try:
            if name is None:
                return self._json(404, status_object(404, "NotFound", "the server could not find the resource"))
            content_type = (self.headers.get("Content-Type") or "").split(";")[0]
            if content_type != MERGE_PATCH:
                return self._json(415, status_object(415, "UnsupportedMediaType", f"{content_type} not supported"))
            with kube._lock:
                queue = kube.queues.get(name)
                if queue is None:
                    message = f'clusterqueues.kueue.x-k8s.io "{name}" not found'
                    return self._json(404, status_object(404, "NotFound", message))
                patched = merge_patch(queue, body)
                problems = check_objects([(f"patch/{name}", patched)])
                if problems:
                    message = "; ".join(p.message for p in problems)
                    return self._json(422, status_object(422, "Invalid", message))
                kube.queues[name] = patched
                kube.patches.append(Patch(name, body, kube.on_patch(), kube.node_polls))
            self._json(200, patched)
        except Exception as exc:  # a broken fake must fail the test, not hang it
            kube.handler_errors.append(f"{type(exc).__name__}: {exc}")
            raise

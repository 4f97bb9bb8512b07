"""FakeKube with objects that can be deleted, and the controllers that finish a delete: the loopback
Kubernetes API `trainctl drain` is tested against.

Served (list and delete, namespaced): `/apis/{group}/{version}/namespaces/NS/{plural}[/NAME]` (batch Jobs,
ray.io RayJobs and RayClusters, kueue.x-k8s.io Workloads) and `/api/v1/namespaces/NS/{pods,
persistentvolumeclaims}[/NAME]`. A DELETE sets deletionTimestamp; the object goes once its finalizers are
gone. Between requests the controllers act, one step per request, as far as they run:
- garbage collection: an object whose owner is gone is deleted (propagationPolicy Background);
- KubeRay (`kuberay_running`): a deleted RayJob deletes its RayCluster; a deleted RayCluster its pods;
- the Job controller: a deleted Job's pods are deleted (by garbage collection, above);
- Kueue (`kueue_running`): a Workload whose job is gone loses its finalizer kueue.x-k8s.io/resource-in-use;
- the PVC protection controller: a deleted claim loses kubernetes.io/pvc-protection once no pod mounts it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.trainctl.fake_kube import FakeKube, Recorded, _Handler, status_object

KUEUE_FINALIZER = "kueue.x-k8s.io/resource-in-use"
PVC_PROTECTION = "kubernetes.io/pvc-protection"
CORE = ("", "v1")


def _uid(namespace: str, name: str, kind: str) -> str:
    return hashlib.sha256(f"{kind}/{namespace}/{name}".encode()).hexdigest()[:32]


class FakeCluster(FakeKube):
    def __init__(self) -> None:
        super().__init__()
        # (group, version, plural) -> list of objects
        self.store: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self.kuberay_running = True
        self.kueue_running = True
        self.deletes: list[str] = []
        self._store_lock = threading.Lock()
        self._loop.server.RequestHandlerClass = _ClusterHandler

    # --- building objects ---

    def add(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        name: str,
        namespace: str,
        *,
        owner: dict[str, Any] | None = None,
        finalizers: tuple[str, ...] = (),
        spec: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": _uid(namespace, name, kind),
                "finalizers": list(finalizers),
                "ownerReferences": [_ref(owner)] if owner is not None else [],
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": spec or {},
            "status": {"phase": "Running"} if kind == "Pod" else {},
        }
        self.store.setdefault((group, version, plural), []).append(obj)
        return obj

    def job(self, name: str, namespace: str, **kwargs: Any) -> dict[str, Any]:
        return self.add("batch", "v1", "jobs", "Job", name, namespace, **kwargs)

    def rayjob(self, name: str, namespace: str) -> dict[str, Any]:
        return self.add("ray.io", "v1", "rayjobs", "RayJob", name, namespace)

    def raycluster(self, name: str, namespace: str, **kwargs: Any) -> dict[str, Any]:
        return self.add("ray.io", "v1", "rayclusters", "RayCluster", name, namespace, **kwargs)

    def workload(self, name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
        return self.add(
            "kueue.x-k8s.io",
            "v1beta2",
            "workloads",
            "Workload",
            name,
            namespace,
            owner=owner,
            finalizers=(KUEUE_FINALIZER,),
        )

    def pod(self, name: str, namespace: str, owner: dict[str, Any], claim: str | None = None) -> dict[str, Any]:
        volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
        spec = {"containers": [{"name": "main", "image": "trainer:test"}], "volumes": volumes}
        return self.add(*CORE, "pods", "Pod", name, namespace, owner=owner, spec=spec)

    def claim(self, name: str, namespace: str) -> dict[str, Any]:
        return self.add(
            *CORE, "persistentvolumeclaims", "PersistentVolumeClaim", name, namespace, finalizers=(PVC_PROTECTION,)
        )

    def names(self, plural: str) -> list[str]:
        return sorted(
            f"{o['metadata']['namespace']}/{o['metadata']['name']}"
            for (_, _, p), items in self.store.items()
            if p == plural
            for o in items
        )

    # --- the controllers ---

    def step(self) -> None:
        with self._store_lock:
            # What was deleted with no finalizer left goes now: each controller's action shows one step later.
            for key, items in self.store.items():
                self.store[key] = [
                    o for o in items if not (o["metadata"].get("deletionTimestamp") and not o["metadata"]["finalizers"])
                ]
            live = {o["metadata"]["uid"]: o for items in self.store.values() for o in items}
            for obj in live.values():
                meta = obj["metadata"]
                kind = obj["kind"]
                owners = [r["uid"] for r in meta["ownerReferences"]]
                owner_gone = any(uid not in live for uid in owners)
                owner_deleting = any(uid in live and live[uid]["metadata"].get("deletionTimestamp") for uid in owners)
                if owner_gone and not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = "2026-01-01T01:00:00Z"  # garbage collection
                if kind == "RayCluster" and owner_deleting and self.kuberay_running:
                    meta.setdefault("deletionTimestamp", "2026-01-01T01:00:00Z")
                if kind == "Workload" and self.kueue_running and (owner_gone or owner_deleting):
                    meta["finalizers"] = [f for f in meta["finalizers"] if f != KUEUE_FINALIZER]
                if kind == "PersistentVolumeClaim" and meta.get("deletionTimestamp"):
                    claim = meta["name"]
                    in_use = any(
                        p["kind"] == "Pod"
                        and p["metadata"]["namespace"] == meta["namespace"]
                        and any(
                            (v.get("persistentVolumeClaim") or {}).get("claimName") == claim
                            for v in p["spec"]["volumes"]
                        )
                        for p in live.values()
                    )
                    if not in_use:
                        meta["finalizers"] = [f for f in meta["finalizers"] if f != PVC_PROTECTION]

    def find(self, key: tuple[str, str, str], namespace: str, name: str | None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.store.get(key, [])
            if o["metadata"]["namespace"] == namespace and (name is None or o["metadata"]["name"] == name)
        ]


def _ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }


def _route(path: str) -> tuple[tuple[str, str, str], str, str | None] | None:
    """((group, version, plural), namespace, name) of a namespaced resource path."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (5, 6):
        return (*CORE, parts[4]), parts[3], parts[5] if len(parts) == 6 else None
    if parts[:1] == ["apis"] and len(parts) in (6, 7) and parts[3] == "namespaces":
        return (parts[1], parts[2], parts[5]), parts[4], parts[6] if len(parts) == 7 else None
    return None


class _ClusterHandler(_Handler):
    @property
    def cluster(self) -> FakeCluster:
        fake = self.fake
        assert isinstance(fake, FakeCluster)
        return fake

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        self.fake.record(Recorded(method, url.path, parse_qs(url.query), self.headers.get("Authorization")))
        route = _route(url.path)
        if route is None:
            return self._json(404, status_object(404, "NotFound", f"no route {url.path}"))
        key, namespace, name = route
        cluster = self.cluster
        cluster.step()
        if key not in cluster.store and key[0] not in ("", "batch"):
            return self._json(404, status_object(404, "NotFound", "the server could not find the requested resource"))
        with cluster._store_lock:
            found = cluster.find(key, namespace, name)
            if method == "GET" and name is None:
                listing = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": found}
                return self._json(200, json.loads(json.dumps(listing)))
            if not found:
                return self._json(404, status_object(404, "NotFound", f'{key[2]} "{name}" not found'))
            obj = found[0]
            if method == "DELETE":
                cluster.deletes.append(f"{obj['kind']} {namespace}/{name} {body.get('propagationPolicy') or 'default'}")
                obj["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
            return self._json(200, json.loads(json.dumps(obj)))

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        try:
            self._serve("GET")
        except Exception as exc:
            self.fake.handler_errors.append(f"{type(exc).__name__}: {exc}")
            raise

    def do_DELETE(self) -> None:  # noqa: N802 (http.server's name)
        try:
            self._serve("DELETE")
        except Exception as exc:
            self.fake.handler_errors.append(f"{type(exc).__name__}: {exc}")
            raise

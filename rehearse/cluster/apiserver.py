"""The Kubernetes API a cluster rehearsal's pods reach: the calls the fabric gate and its remediation controller
make (training/kube_api.py KubeApi, fabric_controller/), served over HTTP from this process, and nothing else.

    GET   /api/v1/nodes/NAME                     the node as the scheduler model holds it (labels, taints, a uid)
    PATCH /api/v1/nodes/NAME                     application/json-patch+json (RFC 6902 add, remove, replace, test)
    GET   /api/v1/nodes?labelSelector=           the nodes whose labels match (k=v, comma-separated)
    POST  /api/v1/namespaces/NS/events           a core/v1 Event (generateName honoured)
    GET   /api/v1/namespaces/NS/events?fieldSelector=   Events by reason and involvedObject.uid
    GET   /api/v1/namespaces/NS/pods/NAME        a pod of the run (its controller's metadata, spec.nodeName, phase)
    GET   /apis/batch/v1/namespaces/NS/jobs/NAME           a Job of the run (a RayJob's submitter too)
    GET   /apis/ray.io/v1/namespaces/NS/rayclusters/NAME   a RayCluster of the run (a RayJob's current one too)
    GET   /apis/ray.io/v1/namespaces/NS/rayjobs/NAME       a RayJob of the files (with a uid)
    GET   /apis/kueue.x-k8s.io/v1beta2/namespaces/NS/workloads?labelSelector=   the Kueue model's Workloads
    GET   /apis/kueue.x-k8s.io/v1beta2/clusterqueues/NAME  a ClusterQueue of the environment
    PATCH /apis/kueue.x-k8s.io/v1beta2/clusterqueues/NAME  application/merge-patch+json (RFC 7386): annotations,
                                                           nominalQuota and stopPolicy, admitted by the policies;
                                                           the Kueue model follows at once

Objects a controller owns carry the ownerReferences it sets: a Job's pods the Job (Kubernetes 1.36
pkg/controller/job/job_controller.go, metav1.NewControllerRef), a RayCluster's pods the RayCluster and a RayJob's
RayCluster and submitter Job the RayJob (KubeRay v1.7.0 raycluster_controller.go createHeadPod/createWorkerPod and
rayjob_controller.go constructRayClusterForRayJob, SetControllerReference), a Deployment's pods its ReplicaSet
(rehearse/deployment.py). A pod's uid is the one the downward API gives it (PodPlan.uid); a RayCluster's and a
RayJob's are stable per name (rehearse/pods.py object_uid); a Job's is its controller's (the controller-uid label's).
A pod deleted by its controller, evicted or killed is gone (404); a Job's ended pods stay, as on a cluster. Kueue
labels each Workload with its job's uid (kueue.x-k8s.io/job-uid: Kueue v0.19.2 pkg/controller/constants
JobUIDLabel, set by pkg/controller/jobframework when it constructs the Workload); the Workload's name is the model's
(without the owner-uid hash Kueue appends).

An Event whose involvedObject.uid is not the object's (for a node: its uid, or its name as the kubelet writes it) is
stored and noted: `kubectl describe` would not list it (kubectl v0.36 pkg/describe/describe.go searchEvents selects
by involvedObject.uid).

Where it listens: on the bridge network, on the hub's gateway address (the pods' default route; the socket is
made inside the hub's network namespace); on the loopback fallback, on 127.0.0.1. Every pod gets the address in
FABRIC_GATE_API_URL and, when its service-account token is mounted (automountServiceAccountToken, the pod's, else
its ServiceAccount's, else true), a token of its own in FABRIC_GATE_API_TOKEN that authenticates as
system:serviceaccount:NS:SA, as the kubelet's projected token does.

Each request is authenticated (401 without a known token), authorized by the RBAC objects of the files (403 with
the API server's Forbidden text; resourceNames honoured; before the object is looked up, as the API server's
authorization filter runs before its handler), admitted by their ValidatingAdmissionPolicies (422) and validated as
the API server validates it (a taint's effect and uniqueness; an Event's namespace against its involvedObject,
pkg/apis/core/validation/events.go legacyValidateEvent, Kubernetes 1.36). An object that does not exist is 404
NotFound; a write whose resourceVersion precondition is stale is 409 Conflict with the API server's text
(staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go OptimisticLockErrorMsg). A node's new taints
reach the scheduler at once: a NoSchedule taint added at runtime keeps new pods off the node.

What it cannot emulate makes the rehearsal exit 2 naming it (`unemulated`, which the run loop checks every tick):
any other path, verb or query parameter, a selector other than equality on the fields above, another patch type, a
JSON patch `move`/`copy`, a patch that changes anything of a node but its taints or of a ClusterQueue but its
annotations, nominal quotas and stopPolicy, a NoExecute taint (taint-based eviction at runtime is not modelled).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rehearse.cluster.authz import Policies, Rbac, User, forbidden_message
from rehearse.cluster.kueue import Kueue, KueueError, Queues
from rehearse.cluster.nodes import ClusterNode
from rehearse.pods import object_uid
from training.fabric_gate import API_TOKEN_ENV, API_URL_ENV

if TYPE_CHECKING:
    from rehearse.controller import Controller
    from rehearse.network import Network
    from rehearse.pods import Pod, PodPlan

__all__ = ["ApiError", "ClusterApi", "UnemulatedError", "object_uid"]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
_NS = r"(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
_NAME = r"(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
# (route, methods, path, the query parameters it serves)
_ROUTES: tuple[tuple[str, tuple[str, ...], re.Pattern[str], frozenset[str]], ...] = (
    ("node", ("GET", "PATCH"), re.compile(rf"^/api/v1/nodes/{_NAME}$"), frozenset()),
    ("nodes", ("GET",), re.compile(r"^/api/v1/nodes$"), frozenset({"labelSelector"})),
    ("events", ("GET", "POST"), re.compile(rf"^/api/v1/namespaces/{_NS}/events$"), frozenset({"fieldSelector"})),
    ("pod", ("GET",), re.compile(rf"^/api/v1/namespaces/{_NS}/pods/{_NAME}$"), frozenset()),
    ("job", ("GET",), re.compile(rf"^/apis/batch/v1/namespaces/{_NS}/jobs/{_NAME}$"), frozenset()),
    ("raycluster", ("GET",), re.compile(rf"^/apis/ray.io/v1/namespaces/{_NS}/rayclusters/{_NAME}$"), frozenset()),
    ("rayjob", ("GET",), re.compile(rf"^/apis/ray.io/v1/namespaces/{_NS}/rayjobs/{_NAME}$"), frozenset()),
    (
        "workloads",
        ("GET",),
        re.compile(rf"^/apis/{KUEUE_API}/namespaces/{_NS}/workloads$"),
        frozenset({"labelSelector"}),
    ),
    ("clusterqueue", ("GET", "PATCH"), re.compile(rf"^/apis/{KUEUE_API}/clusterqueues/{_NAME}$"), frozenset()),
)
ROUTES = (
    "GET/PATCH /api/v1/nodes/NAME, GET /api/v1/nodes?labelSelector, POST and GET?fieldSelector "
    "/api/v1/namespaces/NS/events, GET /api/v1/namespaces/NS/pods/NAME, GET /apis/batch/v1/namespaces/NS/jobs/NAME, "
    "GET /apis/ray.io/v1/namespaces/NS/rayclusters/NAME and rayjobs/NAME, GET "
    f"/apis/{KUEUE_API}/namespaces/NS/workloads?labelSelector, GET/PATCH /apis/{KUEUE_API}/clusterqueues/NAME"
)
# Event fields a fieldSelector may select on here (Kubernetes 1.36 pkg/registry/core/event/strategy.go
# ToSelectableFields offers more; these are the ones the gate and its controller use).
EVENT_FIELDS = ("reason", "involvedObject.uid")


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Kinds whose scope legacyValidateEvent knows (isNamespacedKind over the legacy scheme); others are not checked.
CLUSTER_SCOPED = {("v1", "Node"), ("v1", "Namespace"), ("v1", "PersistentVolume")}
NAMESPACED = {("v1", "Pod"), ("v1", "Service"), ("v1", "ConfigMap"), ("batch/v1", "Job")}
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class UnemulatedError(Exception):
    pass


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


# -- RFC 6902 ------------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    target = doc
    for part in parts[:-1]:
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise ApiError(422, "Invalid", f"JSON patch: path {path!r} does not exist")
    return target


def json_patch(document: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
    doc = copy.deepcopy(document)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", f"JSON patch operation {op!r} needs op and path")
        kind, path = op["op"], op["path"]
        if kind in ("move", "copy"):
            raise UnemulatedError(f"JSON patch op {kind!r}")
        if kind not in ("add", "remove", "replace", "test"):
            raise ApiError(400, "BadRequest", f"JSON patch: unknown op {kind!r}")
        parts = _pointer(path)
        parent = _parent(doc, parts, path)
        key = parts[-1]
        if isinstance(parent, list):
            index = len(parent) if key == "-" and kind == "add" else int(key) if key.isdigit() else -1
            if not 0 <= index <= len(parent) - (kind != "add"):
                raise ApiError(422, "Invalid", f"JSON patch: index {key!r} out of range at {path!r}")
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "remove":
                parent.pop(index)
            elif kind == "replace":
                parent[index] = op["value"]
            elif parent[index] != op["value"]:
                raise ApiError(422, "Invalid", f"JSON patch: testing value {path!r} failed")
        elif isinstance(parent, dict):
            if kind != "add" and key not in parent:
                raise ApiError(422, "Invalid", f"JSON patch: path {path!r} does not exist")
            if kind in ("add", "replace"):
                parent[key] = op["value"]
            elif kind == "remove":
                del parent[key]
            elif parent[key] != op["value"]:
                raise ApiError(422, "Invalid", f"JSON patch: testing value {path!r} failed")
        else:
            raise ApiError(422, "Invalid", f"JSON patch: {path!r} is inside a scalar")
    return doc


# -- routes, queries and selectors ---------------------------------------------------------------------


def _route(method: str, raw: str) -> tuple[str, re.Match[str], dict[str, str]]:
    """The route a request takes and its query; UnemulatedError for any other path, verb or query parameter."""
    path, _, query_text = raw.partition("?")
    for route, methods, pattern, params in _ROUTES:
        found = pattern.match(path)
        if found is None:
            continue
        if method not in methods:
            raise UnemulatedError(f"{method} {path}")
        pairs = urllib.parse.parse_qsl(query_text, keep_blank_values=True) if query_text else []
        query: dict[str, str] = {}
        for key, value in pairs:
            if key not in params or method != "GET" or key in query:
                raise UnemulatedError(f"{method} {raw}: query parameter {key!r}")
            query[key] = value
        return route, found, query
    raise UnemulatedError(f"{method} {raw}")


def _equalities(selector: str, what: str) -> list[tuple[str, str]]:
    """`k=v,k2==v2` as (key, value) pairs; any other operator (!=, in, notin, exists) is not emulated."""
    pairs = []
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        key, op, value = term.partition("==") if "==" in term else term.partition("=")
        if not op or key.endswith("!") or not key.strip() or any(c in term for c in "()! "):
            raise UnemulatedError(f"{what} {selector!r} (only k=v equality terms)")
        pairs.append((key.strip(), value.strip()))
    return pairs


def label_selector(selector: str) -> Callable[[Mapping[str, Any]], bool]:
    pairs = _equalities(selector, "labelSelector")

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in pairs)

    return matches


def event_field_selector(selector: str) -> Callable[[Mapping[str, Any]], bool]:
    pairs = _equalities(selector, "fieldSelector")
    for key, _ in pairs:
        if key not in EVENT_FIELDS:
            raise UnemulatedError(f"fieldSelector on Event field {key!r} (it selects on {', '.join(EVENT_FIELDS)})")

    def value(event: Mapping[str, Any], key: str) -> str:
        if key == "reason":
            return str(event.get("reason") or "")
        return str((event.get("involvedObject") or {}).get("uid") or "")

    return lambda event: all(value(event, k) == v for k, v in pairs)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server applies for application/merge-patch+json)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _queue_shape(queue: Mapping[str, Any]) -> dict[str, Any]:
    """A ClusterQueue without what a patch may change here: annotations, resourceVersion, nominal quotas, stopPolicy."""
    out = copy.deepcopy(dict(queue))
    out.get("metadata", {}).pop("annotations", None)
    out.get("metadata", {}).pop("resourceVersion", None)
    out.get("spec", {}).pop("stopPolicy", None)
    for group in (out.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                resource.pop("nominalQuota", None)
    return out


def _with_status(queue: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the ClusterQueue with its Active condition as Kueue's cache reports it (active_condition)."""
    out = copy.deepcopy(dict(queue))
    active, reason, message = Queues.from_objects([queue]).cluster_queues[queue["metadata"]["name"]].active_condition()
    condition = {"type": "Active", "status": str(active), "reason": reason, "message": message}
    out["status"] = {**(out.get("status") or {}), "conditions": [condition]}
    return out


def _conflict(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": the object has been modified; please apply your '
        "changes to the latest version and try again",
    )


def _controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), None)


# -- the server ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    user: str
    code: int


class ClusterApi:
    """The API server of one cluster rehearsal over its nodes (the scheduler's) and the files' objects."""

    def __init__(
        self,
        nodes: list[ClusterNode],
        objects: Iterable[Mapping[str, Any]],
        log: Callable[[str], None] = print,
        *,
        kueue: Kueue | None = None,
        queues: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        objects = list(objects)
        # The environment's ClusterQueues (k8s/queueing.py queue_objects, as the Platform stack applies them) and the
        # Kueue model that admits by them: a merge patch of a nominalQuota or the stopPolicy changes the model's queue.
        self.kueue = kueue
        self.cluster_queues = {
            q["metadata"]["name"]: {
                **copy.deepcopy(dict(q)),
                "metadata": {
                    **copy.deepcopy(q["metadata"]),
                    "uid": object_uid("ClusterQueue", "", q["metadata"]["name"]),
                    "resourceVersion": "1",
                },
            }
            for q in queues
            if q.get("kind") == "ClusterQueue"
        }
        self._controllers: list[Controller] = []
        self._pods: Mapping[str, Pod] = {}
        self.nodes = {n.name: n for n in nodes}
        self.rbac = Rbac(objects)
        self.policies = Policies(objects)
        self.service_accounts = {
            (o["metadata"].get("namespace", "default"), o["metadata"]["name"]): o
            for o in objects
            if o.get("kind") == "ServiceAccount"
        }
        self.ray_jobs = {
            (o["metadata"].get("namespace", "default"), o["metadata"]["name"]): o
            for o in objects
            if o.get("kind") == "RayJob"
        }
        self.log = log
        self.events: list[dict[str, Any]] = []
        self.requests: list[Request] = []
        self.actions: list[str] = []
        self.notes: list[str] = []
        self._problems: list[str] = []
        self._tokens: dict[str, User] = {}
        self._versions = {name: 1 for name in self.nodes}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- the run's side ----------------------------------------------------------------------------
    def start(self, network: Network) -> None:
        sock, host = network.listen()
        self._server = _Server(sock, self)
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="rehearsal-apiserver", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def attach(self, controllers: Iterable[Controller], pods: Mapping[str, Pod]) -> None:
        """The run's workloads and pods (the run loop's), which the object routes read while the run goes on."""
        self._controllers = list(controllers)
        self._pods = pods

    def unemulated(self) -> str | None:
        with self._lock:
            return self._problems[0] if self._problems else None

    def pod_env(self, plan: PodPlan) -> dict[str, str]:
        if not self.url:
            return {}
        account = str(plan.spec.get("serviceAccountName") or "default")
        found = self.service_accounts.get((plan.namespace, account))
        mount = plan.spec.get("automountServiceAccountToken")
        if mount is None:
            mount = (found or {}).get("automountServiceAccountToken", True)
        env = {API_URL_ENV: self.url}
        if not mount:
            return env
        if found is None and account != "default":
            note = (
                f"ServiceAccount {plan.namespace}/{account} is not in the files: a cluster would not create pod "
                f"{plan.name} until it exists; here its token is issued and the files' RBAC decides"
            )
            if note not in self.notes:
                self.notes.append(note)
        token = secrets.token_hex(16)
        with self._lock:
            self._tokens[token] = User.service_account(plan.namespace, account)
        env[API_TOKEN_ENV] = token
        return env

    def node_object(self, node: ClusterNode) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if node.taints:
            spec["taints"] = [dict(t) for t in node.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "uid": object_uid("Node", "", node.name),
                "labels": dict(node.labels),
                "resourceVersion": str(self._versions[node.name]),
            },
            "spec": spec,
            "status": {
                "allocatable": {k: str(v) for k, v in node.allocatable.items()},
                "conditions": [{"type": "Ready", "status": "True" if node.ready else "Unknown"}],
            },
        }

    # -- the handlers --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        user = "-"
        try:
            route, found, query = _route(method, path)
            who = self._authenticate(headers)
            user = who.name
            code, answer = self._dispatch(who, method, route, found, query, headers, body)
        except UnemulatedError as exc:
            problem = f"the rehearsal's API server does not emulate {exc} (it serves {ROUTES})"
            with self._lock:
                self._problems.append(problem)
            code, answer = 501, status(501, "NotImplemented", problem)
        except ApiError as exc:
            code, answer = exc.code, status(exc.code, exc.reason, exc.message)
        with self._lock:
            self.requests.append(Request(method, path, user, code))
        return code, answer

    def _dispatch(
        self,
        who: User,
        method: str,
        route: str,
        found: re.Match[str],
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: bytes,
    ) -> tuple[int, dict[str, Any]]:
        groups = found.groupdict()
        namespace, name = groups.get("ns") or "", groups.get("name") or ""
        content_type = headers.get("Content-Type", "")
        if route == "node":
            if method == "GET":
                return 200, self._get_node(who, name)
            return 200, self._patch_node(who, name, content_type, body)
        if route == "nodes":
            return 200, self._list_nodes(who, query.get("labelSelector", ""))
        if route == "events":
            if method == "POST":
                return 201, self._post_event(who, namespace, body)
            return 200, self._list_events(who, namespace, query.get("fieldSelector", ""))
        if route == "pod":
            return 200, self._get_pod(who, namespace, name)
        if route == "job":
            return 200, self._get_job(who, namespace, name)
        if route == "raycluster":
            return 200, self._get_ray_cluster(who, namespace, name)
        if route == "rayjob":
            return 200, self._get_ray_job(who, namespace, name)
        if route == "workloads":
            return 200, self._list_workloads(who, namespace, query.get("labelSelector", ""))
        if method == "GET":
            return 200, self._get_cluster_queue(who, name)
        return 200, self._patch_cluster_queue(who, name, content_type, body)

    def _authenticate(self, headers: Mapping[str, str]) -> User:
        token = headers.get("Authorization", "").removeprefix("Bearer ").strip()
        with self._lock:
            user = self._tokens.get(token)
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _authorize(
        self, user: User, verb: str, resource: str, *, namespace: str = "", name: str = "", group: str = ""
    ) -> None:
        if not self.rbac.allowed(user, verb, group, resource, namespace=namespace, name=name):
            message = forbidden_message(user, verb, group, resource, namespace=namespace, name=name)
            raise ApiError(403, "Forbidden", message)

    def _get_ray_job(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "rayjobs", namespace=namespace, name=name, group="ray.io")
        found = self.ray_jobs.get((namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f'rayjobs.ray.io "{name}" not found')
        uid = found["metadata"].get("uid") or object_uid("RayJob", namespace, name)
        meta = {**found["metadata"], "namespace": namespace, "uid": uid}
        return {**copy.deepcopy(found), "metadata": meta}

    # -- the run's objects ---------------------------------------------------------------------------
    def _live_pods(self) -> list[Pod]:
        # A pod its controller deleted, or one deleted with a DisruptionTarget (evicted, killed), is gone from the
        # API; a Job's pods that ended stay (the Job keeps them until it is deleted).
        return [
            p
            for p in list(self._pods.values())
            if not p.deleted_by_controller
            and not (p.ended is not None and any(c.get("type") == "DisruptionTarget" for c in p.conditions))
        ]

    def pod_object(self, pod: Pod) -> dict[str, Any]:
        plan = pod.plan
        meta: dict[str, Any] = {
            "name": plan.name,
            "namespace": plan.namespace,
            "uid": plan.uid,
            "labels": dict(plan.labels),
            "annotations": dict(plan.annotations),
            "ownerReferences": copy.deepcopy(plan.owner_references),
        }
        spec = copy.deepcopy(plan.spec)
        if pod.launched is not None and pod.node:
            spec["nodeName"] = pod.node
        status: dict[str, Any] = {"phase": pod.phase}
        if pod.address:
            status["podIP"] = pod.address
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}

    def _get_pod(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "pods", namespace=namespace, name=name)
        for pod in self._live_pods():
            if pod.plan.namespace == namespace and pod.name == name:
                return self.pod_object(pod)
        raise ApiError(404, "NotFound", f'pods "{name}" not found')

    def _jobs(self) -> list[Any]:
        """The run's JobControllers: its Jobs and each RayJob's current submitter Job."""
        out = [c for c in self._controllers if c.kind == "Job"]
        out += [s for c in self._controllers if c.kind == "RayJob" and (s := getattr(c, "submitter", None))]
        return out

    def _get_job(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "jobs", namespace=namespace, name=name, group="batch")
        for job in self._jobs():
            if job.namespace == namespace and job.name == name:
                obj = copy.deepcopy(job.obj)
                meta = {**obj.get("metadata", {}), "namespace": namespace, "uid": job.uid}
                status = {"conditions": copy.deepcopy(job.conditions), "active": len(job.active)}
                return {**obj, "apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "status": status}
        raise ApiError(404, "NotFound", f'jobs.batch "{name}" not found')

    def _ray_clusters(self) -> list[tuple[Any, bool]]:
        """(RayClusterPods, ready) of every RayCluster that exists now: the standalone ones, and each RayJob's
        current cluster while any of its pods exists (KubeRay deletes it on a retry or after the job)."""
        out = []
        for c in self._controllers:
            if c.kind == "RayCluster":
                out.append((c.cluster, bool(getattr(c, "ready", False))))  # type: ignore[attr-defined]
            elif c.kind == "RayJob" and getattr(c, "selected", None) is None:
                pods = getattr(c, "cluster_pods", [])
                if any(p.running for p in pods):
                    out.append((c.cluster, False))  # type: ignore[attr-defined]
        return out

    def _get_ray_cluster(self, user: User, namespace: str, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "rayclusters", namespace=namespace, name=name, group="ray.io")
        for cluster, ready in self._ray_clusters():
            if cluster.namespace == namespace and cluster.name == name:
                labels = {}
                owner = _controller_of({"metadata": {"ownerReferences": cluster.owner_references}})
                if owner is not None:
                    # KubeRay v1.7.0 rayjob_controller.go constructRayClusterForRayJob: the originated-from labels.
                    labels = {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": owner["name"]}
                meta = {
                    "name": name,
                    "namespace": namespace,
                    "uid": cluster.uid,
                    "labels": labels,
                    "ownerReferences": copy.deepcopy(cluster.owner_references),
                }
                status = {"state": "ready"} if ready else {}
                spec = copy.deepcopy(cluster.spec)
                kind = {"apiVersion": "ray.io/v1", "kind": "RayCluster"}
                return {**kind, "metadata": meta, "spec": spec, "status": status}
        raise ApiError(404, "NotFound", f'rayclusters.ray.io "{name}" not found')

    def _job_uid(self, kind: str, namespace: str, name: str) -> str:
        for c in self._controllers:
            if c.kind == kind and c.namespace == namespace and c.name == name:
                uid = getattr(c, "uid", None)
                if uid:
                    return str(uid)
        return object_uid(kind, namespace, name)

    def workload_objects(self, namespace: str) -> list[dict[str, Any]]:
        """The Kueue model's Workloads of `namespace`, as Kueue writes them: the job-uid and queue-name labels,
        owned by the job, status.conditions (Admitted among them) as the model holds them."""
        if self.kueue is None:
            return []
        out = []
        for workload in self.kueue.all_workloads():
            spec = workload.spec
            if spec.namespace != namespace:
                continue
            uid = self._job_uid(spec.kind, spec.namespace, spec.name)
            api_version = "batch/v1" if spec.kind == "Job" else "ray.io/v1"
            conditions = [
                {"type": c.type, "status": "True" if c.status else "False", "reason": c.reason, "message": c.message}
                for c in list(workload.conditions.values())
            ]
            out.append(
                {
                    "apiVersion": KUEUE_API,
                    "kind": "Workload",
                    "metadata": {
                        "name": workload.name,
                        "namespace": namespace,
                        "uid": object_uid("Workload", namespace, workload.name),
                        "labels": {JOB_UID_LABEL: uid, QUEUE_NAME_LABEL: spec.queue_name},
                        "ownerReferences": [
                            {
                                "apiVersion": api_version,
                                "kind": spec.kind,
                                "name": spec.name,
                                "uid": uid,
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": {"queueName": spec.queue_name, "active": workload.active},
                    "status": {"conditions": conditions},
                }
            )
        return out

    def _list_workloads(self, user: User, namespace: str, selector: str) -> dict[str, Any]:
        self._authorize(user, "list", "workloads", namespace=namespace, group="kueue.x-k8s.io")
        matches = label_selector(selector)
        items = [w for w in self.workload_objects(namespace) if matches(w)]
        return {"apiVersion": KUEUE_API, "kind": "WorkloadList", "metadata": {}, "items": items}

    def _list_nodes(self, user: User, selector: str) -> dict[str, Any]:
        self._authorize(user, "list", "nodes")
        matches = label_selector(selector)
        with self._lock:
            items = [o for o in (self.node_object(n) for n in self.nodes.values()) if matches(o)]
        return {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items}

    def _list_events(self, user: User, namespace: str, selector: str) -> dict[str, Any]:
        self._authorize(user, "list", "events", namespace=namespace)
        matches = event_field_selector(selector)
        with self._lock:
            items = [copy.deepcopy(e) for e in self.events if e["metadata"]["namespace"] == namespace and matches(e)]
        return {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items}

    # -- ClusterQueues -------------------------------------------------------------------------------
    def _cluster_queue(self, name: str) -> dict[str, Any]:
        found = self.cluster_queues.get(name)
        if found is None:
            raise ApiError(404, "NotFound", f'clusterqueues.kueue.x-k8s.io "{name}" not found')
        return found

    def _get_cluster_queue(self, user: User, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "clusterqueues", name=name, group="kueue.x-k8s.io")
        with self._lock:
            return _with_status(self._cluster_queue(name))

    def _patch_cluster_queue(self, user: User, name: str, content_type: str, body: bytes) -> dict[str, Any]:
        self._authorize(user, "patch", "clusterqueues", name=name, group="kueue.x-k8s.io")
        kind = content_type.split(";")[0].strip()
        if kind != MERGE_PATCH:
            raise UnemulatedError(f"PATCH of a ClusterQueue with Content-Type {kind or 'none'!r} (only {MERGE_PATCH})")
        patch = _json(body)
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch is a JSON object")
        with self._lock:
            current = self._cluster_queue(name)
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and str(wanted) != current["metadata"]["resourceVersion"]:
                raise _conflict("clusterqueues.kueue.x-k8s.io", name)
            new = merge_patch(current, patch)
            if _queue_shape(new) != _queue_shape(current):
                raise UnemulatedError(
                    f"a ClusterQueue patch of {name} that changes more than metadata.annotations, "
                    "spec.resourceGroups[].flavors[].resources[].nominalQuota and spec.stopPolicy (what the Kueue "
                    "model applies)"
                )
            try:
                parsed = Queues.from_objects([new]).cluster_queues[name]
            except (KueueError, ValueError, KeyError) as exc:
                raise ApiError(422, "Invalid", f'ClusterQueue.kueue.x-k8s.io "{name}" is invalid: {exc}') from None
            denial = self.policies.denied(
                user,
                operation="UPDATE",
                group="kueue.x-k8s.io",
                version="v1beta2",
                resource="clusterqueues",
                obj=new,
                old=current,
            )
            if denial is not None:
                raise ApiError(422, "Invalid", f'clusterqueues.kueue.x-k8s.io "{name}" is forbidden: {denial}')
            new["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            self.cluster_queues[name] = new
            if self.kueue is not None:
                self.kueue.update_cluster_queue(parsed)
            quota = _quota_text(new)
            action = f"{user.name} patched ClusterQueue {name}: nominalQuota now {quota}"
            if "stopPolicy" in (patch.get("spec") or {}):
                action += f", stopPolicy {parsed.stop_policy}"
            self.actions.append(action)
            self.log(f"api: {action}")
            return _with_status(new)

    def _uid_note(self, namespace: str, name: str, involved: Mapping[str, Any]) -> str | None:
        """Why `kubectl describe` would not list this Event under its object, if it would not."""
        kind, target, uid = str(involved.get("kind")), str(involved.get("name")), involved.get("uid")
        if kind == "Node" and target in self.nodes:
            known: tuple[str, ...] = (object_uid("Node", "", target), target)
        elif kind == "RayJob" and (namespace, target) in self.ray_jobs:
            known = (str(self.ray_jobs[(namespace, target)]["metadata"].get("uid") or ""),)
            known = (known[0] or object_uid("RayJob", namespace, target),)
        elif kind == "Pod" and (
            pods := [p for p in self._live_pods() if (p.plan.namespace, p.name) == (namespace, target)]
        ):
            known = tuple(p.plan.uid for p in pods)
        elif kind == "Job" and (jobs := [j for j in self._jobs() if (j.namespace, j.name) == (namespace, target)]):
            known = tuple(str(j.uid) for j in jobs)
        elif uid:
            return None  # an object this server does not hold: its uid is not checked
        else:
            known = ()
        if uid in known:
            return None
        return (
            f"Event {namespace}/{name} on {kind}/{target} has involvedObject.uid {uid or '(none)'}, not the object's: "
            "`kubectl describe` would not list it (kubectl v0.36 pkg/describe/describe.go searchEvents selects "
            "Events by involvedObject.uid; `kubectl get events` shows it)"
        )

    def _node(self, name: str) -> ClusterNode:
        node = self.nodes.get(name)
        if node is None:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found')
        return node

    def _get_node(self, user: User, name: str) -> dict[str, Any]:
        self._authorize(user, "get", "nodes", name=name)
        with self._lock:
            return self.node_object(self._node(name))

    def _patch_node(self, user: User, name: str, content_type: str, body: bytes) -> dict[str, Any]:
        self._authorize(user, "patch", "nodes", name=name)
        if content_type.split(";")[0].strip() != JSON_PATCH:
            raise UnemulatedError(f"PATCH of a node with Content-Type {content_type or 'none'!r} (only {JSON_PATCH})")
        operations = _json(body)
        with self._lock:
            node = self._node(name)
            old = self.node_object(node)
            new = json_patch(old, operations)
            _only_taints_changed(old, new)
            taints = _valid_taints(new.get("spec", {}).get("taints") or [])
            new_keys = {(t["key"], t["effect"]) for t in taints} - {(t["key"], t["effect"]) for t in node.taints}
            if any(effect == "NoExecute" for _, effect in new_keys):
                raise UnemulatedError("a NoExecute taint added at runtime (taint-based eviction of running pods)")
            denial = self.policies.denied(
                user, operation="UPDATE", group="", version="v1", resource="nodes", obj=new, old=old
            )
            if denial is not None:
                raise ApiError(422, "Invalid", f'nodes "{name}" is forbidden: {denial}')
            node.taints = taints
            self._versions[name] += 1
            added = ", ".join(f"{k}:{e}" for k, e in sorted(new_keys)) or "none added"
            action = f"{user.name} patched node {name} ({node.alias}): taints now {_taint_text(taints)} ({added})"
            self.actions.append(action)
            self.log(f"api: {action}")
            return self.node_object(node)

    def _post_event(self, user: User, namespace: str, body: bytes) -> dict[str, Any]:
        self._authorize(user, "create", "events", namespace=namespace)
        event = _json(body)
        if (
            not isinstance(event, dict)
            or event.get("kind", "Event") != "Event"
            or event.get("apiVersion", "v1") != "v1"
        ):
            raise ApiError(400, "BadRequest", "the body is not a core/v1 Event")
        meta = dict(event.get("metadata") or {})
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if not meta.get("name") and not meta.get("generateName"):
            raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        involved = event.get("involvedObject") or {}
        scope = (str(involved.get("apiVersion", "")), str(involved.get("kind", "")))
        involved_ns = involved.get("namespace") or ""
        errors = []
        if not event.get("eventTime"):
            if not involved_ns and namespace != "default":
                errors.append('involvedObject.namespace: Invalid value: "": does not match event.namespace')
            elif involved_ns and involved_ns != namespace:
                errors.append(
                    f'involvedObject.namespace: Invalid value: "{involved_ns}": does not match event.namespace'
                )
        if scope in NAMESPACED and not involved_ns:
            errors.append(f"involvedObject.namespace: Required value: required for kind {scope[1]}")
        if scope in CLUSTER_SCOPED and involved_ns:
            errors.append(f'involvedObject.namespace: Invalid value: "{involved_ns}": not allowed for kind {scope[1]}')
        if errors:
            name = meta.get("name") or meta.get("generateName")
            raise ApiError(422, "Invalid", f'Event "{name}" is invalid: {", ".join(errors)}')
        with self._lock:
            meta.setdefault("name", f"{meta.get('generateName')}{''.join(secrets.choice(_SUFFIX) for _ in range(5))}")
            meta["namespace"] = namespace
            stored = {**event, "apiVersion": "v1", "kind": "Event", "metadata": meta}
            self.events.append(stored)
            note = self._uid_note(namespace, meta["name"], involved)
            if note is not None:
                self.notes.append(note)
            target = f"{involved.get('kind')}/{involved.get('name')}"
            action = f"{user.name} posted Event {namespace}/{meta['name']} on {target}: {event.get('reason')}"
            self.actions.append(action)
            self.log(f"api: {action}")
        return stored

    def report(self) -> dict[str, Any]:
        """The API's side of the run for the report: what was done, the Events, every request."""
        with self._lock:
            return {
                "url": self.url,
                "actions": list(self.actions),
                "events": [
                    {
                        "namespace": e["metadata"]["namespace"],
                        "name": e["metadata"]["name"],
                        "involvedObject": e.get("involvedObject"),
                        "reason": e.get("reason"),
                        "type": e.get("type"),
                        "message": e.get("message"),
                    }
                    for e in self.events
                ],
                "requests": [
                    {"method": r.method, "path": r.path, "user": r.user, "code": r.code} for r in self.requests
                ],
                "cluster_queues": {
                    name: {
                        "annotations": dict(q["metadata"].get("annotations") or {}),
                        "resourceGroups": copy.deepcopy((q.get("spec") or {}).get("resourceGroups") or []),
                    }
                    for name, q in self.cluster_queues.items()
                },
            }


def _quota_text(queue: Mapping[str, Any]) -> str:
    parts = []
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            quota = ", ".join(f"{r['name']}={r.get('nominalQuota')}" for r in flavor.get("resources") or [])
            parts.append(f"{flavor.get('name')}: {quota}")
    return "; ".join(parts) or "none"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None


def _without_taints(node: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(node))
    out.get("spec", {}).pop("taints", None)
    out.get("metadata", {}).pop("resourceVersion", None)
    return out


def _only_taints_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    if _without_taints(old) != _without_taints(new):
        changed = sorted(
            f"{part}.{key}"
            for part in ("metadata", "spec", "status")
            for key in {*(old.get(part) or {}), *(new.get(part) or {})}
            if key not in ("taints", "resourceVersion")
            and (old.get(part) or {}).get(key) != (new.get(part) or {}).get(key)
        ) or sorted(set(old) ^ set(new))
        raise UnemulatedError(
            f"a node patch that changes {', '.join(changed)} (only spec.taints is applied to the model)"
        )


def _valid_taints(taints: Any) -> list[dict[str, str]]:
    if not isinstance(taints, list):
        raise ApiError(422, "Invalid", "spec.taints: Invalid value: must be a list")
    seen: set[tuple[str, str]] = set()
    out = []
    for i, taint in enumerate(taints):
        if not isinstance(taint, dict) or not taint.get("key"):
            raise ApiError(422, "Invalid", f"spec.taints[{i}].key: Required value")
        effect = taint.get("effect", "")
        if effect not in TAINT_EFFECTS:
            raise ApiError(422, "Invalid", f'spec.taints[{i}].effect: Unsupported value: "{effect}"')
        if (taint["key"], effect) in seen:
            raise ApiError(
                422, "Invalid", f"spec.taints[{i}]: Duplicate value: taints must be unique by key and effect"
            )
        seen.add((taint["key"], effect))
        out.append({k: str(v) for k, v in taint.items() if k in ("key", "value", "effect", "timeAdded")})
    return out


def _taint_text(taints: Iterable[Mapping[str, str]]) -> str:
    return ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints) or "none"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: Any, api: ClusterApi) -> None:
        super().__init__(sock.getsockname(), _handler(api), bind_and_activate=False)
        self.socket.close()
        self.socket = sock


def _handler(api: ClusterApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            code, answer = api.handle(self.command, self.path, dict(self.headers.items()), body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()))
            self.end_headers()
            self.wfile.write(data)

        def __getattr__(self, name: str) -> Any:
            # Every verb reaches `handle`, which serves three routes and names any other as not emulated.
            if name.startswith("do_"):
                return self._serve
            raise AttributeError(name)

    return Handler

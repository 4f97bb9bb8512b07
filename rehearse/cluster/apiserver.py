"""The Kubernetes API a cluster rehearsal's pods reach: the calls the fabric gate makes (training/fabric_gate.py
KubeApi), served over HTTP from this process, and nothing else.

    GET   /api/v1/nodes/NAME                     the node as the scheduler model holds it (labels, taints, a uid)
    PATCH /api/v1/nodes/NAME                     application/json-patch+json (RFC 6902 add, remove, replace, test)
    POST  /api/v1/namespaces/NS/events           a core/v1 Event (generateName honoured)
    GET   /apis/ray.io/v1/namespaces/NS/rayjobs/NAME   a RayJob of the files (with a uid)

An Event whose involvedObject.uid is not the object's (for a node: its uid, or its name as the kubelet writes it) is
stored and noted: `kubectl describe` would not list it (kubectl v0.36 pkg/describe/describe.go searchEvents selects
by involvedObject.uid).

Where it listens: on the bridge network, on the hub's gateway address (the pods' default route; the socket is
made inside the hub's network namespace); on the loopback fallback, on 127.0.0.1. Every pod gets the address in
FABRIC_GATE_API_URL and, when its service-account token is mounted (automountServiceAccountToken, the pod's, else
its ServiceAccount's, else true), a token of its own in FABRIC_GATE_API_TOKEN that authenticates as
system:serviceaccount:NS:SA, as the kubelet's projected token does.

Each request is authenticated (401 without a known token), authorized by the RBAC objects of the files (403 with
the API server's Forbidden text), admitted by their ValidatingAdmissionPolicies (422) and validated as the API
server validates it (a taint's effect and uniqueness; an Event's namespace against its involvedObject,
pkg/apis/core/validation/events.go legacyValidateEvent, Kubernetes 1.36). A node's new taints reach the
scheduler at once: a NoSchedule taint added at runtime keeps new pods off the node.

What it cannot emulate makes the rehearsal exit 2 naming it (`unemulated`, which the run loop checks every tick):
any other path, verb or query, another patch type, a JSON patch `move`/`copy`, a patch that changes anything of a
node but its taints, a NoExecute taint (taint-based eviction at runtime is not modelled).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rehearse.cluster.authz import Policies, Rbac, User, forbidden_message
from rehearse.cluster.nodes import ClusterNode
from training.fabric_gate import API_TOKEN_ENV, API_URL_ENV

if TYPE_CHECKING:
    from rehearse.network import Network
    from rehearse.pods import PodPlan

JSON_PATCH = "application/json-patch+json"
ROUTES = (
    "GET/PATCH /api/v1/nodes/NAME, POST /api/v1/namespaces/NS/events, GET /apis/ray.io/v1/namespaces/NS/rayjobs/NAME"
)
_NODE = re.compile(r"^/api/v1/nodes/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/events$")
_RAYJOB = re.compile(
    r"^/apis/ray.io/v1/namespaces/(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/rayjobs/(?P<name>[a-z0-9][-a-z0-9.]*)$"
)


def object_uid(kind: str, namespace: str, name: str) -> str:
    """A stable uid for an object of the rehearsal (the API server's are random; these repeat per name)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"rehearsal:{kind}/{namespace}/{name}"))


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
        self, nodes: list[ClusterNode], objects: Iterable[Mapping[str, Any]], log: Callable[[str], None] = print
    ) -> None:
        objects = list(objects)
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
        self._thread = threading.Thread(target=self._server.serve_forever, name="rehearsal-apiserver", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

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
            if "?" in path:
                raise UnemulatedError(f"{method} {path}: query parameters")
            node, events, ray_job = _NODE.match(path), _EVENTS.match(path), _RAYJOB.match(path)
            route = (method, "node" if node else "events" if events else "rayjob" if ray_job else "")
            if route not in (("GET", "node"), ("PATCH", "node"), ("POST", "events"), ("GET", "rayjob")):
                raise UnemulatedError(f"{method} {path}")
            who = self._authenticate(headers)
            user = who.name
            if ray_job:
                code, answer = 200, self._get_ray_job(who, ray_job["ns"], ray_job["name"])
            elif node:
                if method == "GET":
                    code, answer = 200, self._get_node(who, node["name"])
                else:
                    code, answer = 200, self._patch_node(who, node["name"], headers.get("Content-Type", ""), body)
            else:
                assert events is not None
                code, answer = 201, self._post_event(who, events["ns"], body)
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
        meta = {**found["metadata"], "namespace": namespace, "uid": object_uid("RayJob", namespace, name)}
        return {**copy.deepcopy(found), "metadata": meta}

    def _uid_note(self, namespace: str, name: str, involved: Mapping[str, Any]) -> str | None:
        """Why `kubectl describe` would not list this Event under its object, if it would not."""
        kind, target, uid = str(involved.get("kind")), str(involved.get("name")), involved.get("uid")
        if kind == "Node" and target in self.nodes:
            known: tuple[str, ...] = (object_uid("Node", "", target), target)
        elif kind == "RayJob" and (namespace, target) in self.ray_jobs:
            known = (object_uid("RayJob", namespace, target),)
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
            }


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

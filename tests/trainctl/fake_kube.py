"""A Kubernetes API server, small: on 127.0.0.1, plain http, in a thread; the kubernetes client
talks to it over real HTTP and a real WebSocket.

What it serves, as the API server does:
- `GET /api/v1/namespaces/NS/pods?labelSelector=...` (equality, `!=` and existence selectors),
  `GET /api/v1/namespaces/NS/pods/NAME`, and the pod log (`.../log?container=&follow=&previous=`,
  chunked, so a follow streams);
- `GET /apis/ray.io/v1/namespaces/NS/rayjobs` (the RayJob custom objects);
- the exec endpoint (`.../pods/NAME/exec?command=...`) as a WebSocket: the handshake with
  Sec-WebSocket-Accept and the `v4.channel.k8s.io` subprotocol (or v5, when asked), masked client
  frames, binary frames whose first byte is the channel (0 stdin, 1 stdout, 2 stderr, 3 the exit
  status as a metav1.Status, 255 v5 close), a closing handshake;
- 404 and 400 as metav1.Status JSON.

Every request is recorded with its Authorization header; every exec with its command, container
and the stdin its handler read. What an exec does is scripted: `on_exec(argv prefix, handler)`,
where the handler reads stdin, writes stdout/stderr and returns the exit code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.trainctl.loopback import ServerThread

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
V4 = "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
SOCKET_TIMEOUT_S = 10.0


class ClientClosedError(Exception):
    """The client closed the WebSocket (or the connection) while the handler was reading stdin."""


@dataclass
class ExecCall:
    namespace: str
    pod: str
    container: str | None
    command: list[str]
    stdin_requested: bool
    protocol: str | None
    authorization: str | None
    stdin: bytearray = field(default_factory=bytearray)
    stdin_closed: bool = False
    """A v5 client closed stdin (channel 255)."""
    pings: int = 0
    # Set once the server has read the client's last frames (its pings among them): a test reads `pings` after it.
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Failure:
    """An exec that could not run at all (no exit code), e.g. the executable does not exist."""

    message: str


class ExecSession:
    """What an exec handler gets: the call, stdin to read, and stdout/stderr to write."""

    def __init__(self, handler: BaseHTTPRequestHandler, call: ExecCall) -> None:
        self._handler = handler
        self.call = call

    @property
    def command(self) -> list[str]:
        return self.call.command

    def read_stdin(self, size: int) -> bytes:
        """Exactly `size` bytes of stdin (what `head -c SIZE` reads), fewer if the client ends it first."""
        while len(self.call.stdin) < size:
            frame = _read_frame(self._handler)
            if frame is None:
                raise ClientClosedError("the client closed the connection")
            opcode, payload = frame
            if opcode == 0x8:
                raise ClientClosedError("the client sent a close frame")
            if opcode == 0x9:
                self.call.pings += 1
                _send_frame(self._handler, 0xA, payload)
                continue
            if opcode not in (0x1, 0x2) or not payload:
                continue
            if payload[0] == STDIN:
                self.call.stdin += payload[1:]
            elif payload[0] == CLOSE and payload[1:2] == bytes([STDIN]):
                self.call.stdin_closed = True
                break
        return bytes(self.call.stdin[:size])

    def stdout(self, data: bytes | str) -> None:
        self._send(STDOUT, data)

    def stderr(self, data: bytes | str) -> None:
        self._send(STDERR, data)

    def _send(self, channel: int, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        _send_frame(self._handler, 0x2, bytes([channel]) + raw)


ExecHandler = Callable[[ExecSession], "int | Failure"]


def reply(stdout: bytes | str = b"", stderr: bytes | str = b"", exit_code: int = 0) -> ExecHandler:
    """A handler that writes fixed output and exits with `exit_code`."""

    def handler(session: ExecSession) -> int:
        if stdout:
            session.stdout(stdout)
        if stderr:
            session.stderr(stderr)
        return exit_code

    return handler


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None


@dataclass
class LogScript:
    chunks: list[bytes]
    delay_s: float = 0.0
    """Between chunks (a container writing as it runs)."""


def pod_object(
    name: str,
    *,
    namespace: str = "ray",
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    containers: Sequence[str] = ("ray-head",),
    node: str = "ip-10-10-1-5.us-west-2.compute.internal",
    terminating: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels or {}),
        "uid": hashlib.sha256(name.encode()).hexdigest()[:32],
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if terminating:
        metadata["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": c, "image": "ray:test"} for c in containers], "nodeName": node},
        "status": {"phase": phase},
    }


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def exec_status(result: int | Failure, command: Sequence[str]) -> dict[str, Any]:
    """The metav1.Status the API server writes on channel 3 when the command ends."""
    if isinstance(result, Failure):
        return {"metadata": {}, "status": "Failure", "message": result.message, "reason": "InternalError"}
    if result == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {list(command)}: "
        f"exit status {result}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(result)}]},
    }


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


class FakeKube:
    def __init__(self, *, subprotocol: str = V4) -> None:
        self.subprotocol = subprotocol
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[tuple[str, str, str], LogScript] = {}
        self.rayjobs: list[dict[str, Any]] = []
        self.rayjobs_installed = True
        self.accepted_tokens: set[str] | None = None
        """When set, a request whose bearer token is not one of these gets 401 (as EKS answers)."""
        self.requests: list[Recorded] = []
        self.execs: list[ExecCall] = []
        self.handler_errors: list[str] = []
        self._scripts: list[tuple[Callable[[list[str]], bool], ExecHandler]] = []
        self._lock = threading.Lock()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.fake = self  # type: ignore[attr-defined]
        self._loop = ServerThread(server, "fake-kube")

    @property
    def url(self) -> str:
        return self._loop.url

    def start(self) -> FakeKube:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    # --- scripting ---

    def add_pod(self, name: str, **kwargs: Any) -> dict[str, Any]:
        pod = pod_object(name, **kwargs)
        self.pods.append(pod)
        return pod

    def add_log(self, pod: str, container: str, chunks: Sequence[bytes | str], *, namespace: str = "ray", delay_s=0.0):
        self.logs[(namespace, pod, container)] = LogScript(
            [c.encode() if isinstance(c, str) else c for c in chunks], delay_s
        )

    def on_exec(self, match: Sequence[str] | Callable[[list[str]], bool], handler: ExecHandler) -> None:
        """Commands starting with `match` (or for which it returns True) run `handler`; first match wins."""
        if callable(match):
            predicate = match
        else:
            prefix = list(match)
            predicate = lambda argv: argv[: len(prefix)] == prefix  # noqa: E731
        self._scripts.append((predicate, handler))

    def commands(self) -> list[list[str]]:
        return [call.command for call in self.execs]

    def authorizations(self) -> set[str | None]:
        return {r.authorization for r in self.requests}

    def handler_for(self, argv: list[str]) -> ExecHandler | None:
        return next((handler for predicate, handler in self._scripts if predicate(argv)), None)

    def record(self, entry: Recorded) -> None:
        with self._lock:
            self.requests.append(entry)


# --- WebSocket frames (RFC 6455) ---------------------------------------------------------------


def _read_exact(handler: BaseHTTPRequestHandler, size: int) -> bytes | None:
    data = handler.rfile.read(size) if size else b""
    return data if len(data) == size else None


def _read_frame(handler: BaseHTTPRequestHandler) -> tuple[int, bytes] | None:
    """(opcode, payload) of the next client frame, continuation frames joined; None at EOF."""
    opcode: int | None = None
    payload = bytearray()
    while True:
        try:
            head = _read_exact(handler, 2)
        except (OSError, ValueError):
            return None
        if head is None:
            return None
        fin, frame_opcode = head[0] & 0x80, head[0] & 0x0F
        masked, length = head[1] & 0x80, head[1] & 0x7F
        if not masked:
            raise AssertionError("client frames must be masked (RFC 6455 5.1)")
        if length == 126:
            extended = _read_exact(handler, 2)
            if extended is None:
                return None
            length = struct.unpack("!H", extended)[0]
        elif length == 127:
            extended = _read_exact(handler, 8)
            if extended is None:
                return None
            length = struct.unpack("!Q", extended)[0]
        mask = _read_exact(handler, 4)
        body = _read_exact(handler, length)
        if mask is None or body is None:
            return None
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(body))
        if frame_opcode >= 0x8:  # control frames are never fragmented, and may come between fragments
            return frame_opcode, data
        if frame_opcode != 0:
            opcode = frame_opcode
        payload += data
        if fin:
            return (opcode if opcode is not None else 0x2), bytes(payload)


def _send_frame(handler: BaseHTTPRequestHandler, opcode: int, payload: bytes) -> None:
    length = len(payload)
    if length < 126:
        header = struct.pack("!BB", 0x80 | opcode, length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, length)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, length)
    handler.wfile.write(header + payload)
    handler.wfile.flush()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    @property
    def fake(self) -> FakeKube:
        fake: FakeKube = self.server.fake  # type: ignore[attr-defined]
        return fake

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.connection.settimeout(SOCKET_TIMEOUT_S)
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        self.fake.record(Recorded("GET", url.path, query, self.headers.get("Authorization")))
        parts = url.path.strip("/").split("/")
        accepted = self.fake.accepted_tokens
        if accepted is not None and self.headers.get("Authorization") not in {f"Bearer {t}" for t in accepted}:
            return self._json(401, status_object(401, "Unauthorized", "Unauthorized"))
        try:
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "pods":
                namespace = parts[3]
                if len(parts) == 5:
                    return self._pod_list(namespace, query)
                if len(parts) == 6:
                    return self._pod(namespace, parts[5])
                if len(parts) == 7 and parts[6] == "log":
                    return self._log(namespace, parts[5], query)
                if len(parts) == 7 and parts[6] == "exec":
                    return self._exec(namespace, parts[5], query)
            if parts[:4] == ["apis", "ray.io", "v1", "namespaces"] and len(parts) == 6 and parts[5] == "rayjobs":
                return self._rayjobs(parts[4])
            self._json(
                404, status_object(404, "NotFound", f"the server could not find the requested resource {url.path}")
            )
        except Exception as exc:  # a broken fake must fail the test, not hang it
            self.fake.handler_errors.append(f"{type(exc).__name__}: {exc}")
            raise

    def _json(self, code: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _find(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (p for p in self.fake.pods if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace),
            None,
        )

    def _pod_list(self, namespace: str, query: dict[str, list[str]]) -> None:
        selector = query.get("labelSelector", [""])[0]
        items = [
            p
            for p in self.fake.pods
            if p["metadata"]["namespace"] == namespace and matches(p["metadata"]["labels"], selector)
        ]
        self._json(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})

    def _pod(self, namespace: str, name: str) -> None:
        pod = self._find(namespace, name)
        if pod is None:
            self._json(404, status_object(404, "NotFound", f'pods "{name}" not found'))
        else:
            self._json(200, pod)

    def _log(self, namespace: str, name: str, query: dict[str, list[str]]) -> None:
        pod = self._find(namespace, name)
        if pod is None:
            return self._json(404, status_object(404, "NotFound", f'pods "{name}" not found'))
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container", [containers[0]])[0]
        script = self.fake.logs.get((namespace, name, container))
        if script is None:
            message = f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            return self._json(400, status_object(400, "BadRequest", message))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, chunk in enumerate(script.chunks):
            if index and script.delay_s:
                time.sleep(script.delay_s)
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _rayjobs(self, namespace: str) -> None:
        if not self.fake.rayjobs_installed:
            return self._json(404, status_object(404, "NotFound", "the server could not find the requested resource"))
        items = [j for j in self.fake.rayjobs if j["metadata"].get("namespace", namespace) == namespace]
        self._json(200, {"apiVersion": "ray.io/v1", "kind": "RayJobList", "metadata": {}, "items": items})

    def _exec(self, namespace: str, name: str, query: dict[str, list[str]]) -> None:
        pod = self._find(namespace, name)
        if pod is None:
            return self._json(404, status_object(404, "NotFound", f'pods "{name}" not found'))
        key = self.headers.get("Sec-WebSocket-Key")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            return self._json(400, status_object(400, "BadRequest", "exec needs a WebSocket upgrade"))
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        protocol = self.fake.subprotocol if self.fake.subprotocol in offered else None
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        if protocol:
            self.send_header("Sec-WebSocket-Protocol", protocol)
        self.end_headers()
        self.close_connection = True
        call = ExecCall(
            namespace=namespace,
            pod=name,
            container=query.get("container", [None])[0],
            command=query.get("command", []),
            stdin_requested=query.get("stdin", ["false"])[0].lower() == "true",
            protocol=protocol,
            authorization=self.headers.get("Authorization"),
        )
        self.fake.execs.append(call)
        _send_frame(self, 0x2, bytes([STDOUT]))  # the empty frame that says the stream is open
        handler = self.fake.handler_for(call.command)
        session = ExecSession(self, call)
        if handler is None:
            result: int | Failure = Failure(f'exec: "{call.command[0] if call.command else ""}": not scripted')
        else:
            try:
                result = handler(session)
            except ClientClosedError:
                call.ended.set()
                return
        try:
            _send_frame(self, 0x2, bytes([ERROR]) + json.dumps(exec_status(result, call.command)).encode())
            _send_frame(self, 0x8, struct.pack("!H", 1000))
            self._await_close(call)
        except OSError:
            pass
        finally:
            call.ended.set()

    def _await_close(self, call: ExecCall) -> None:
        """The closing handshake: read frames (noting a v5 stdin close) until the client's close frame."""
        self.connection.settimeout(2)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                frame = _read_frame(self)
            except (TimeoutError, OSError):
                return
            if frame is None or frame[0] == 0x8:
                return
            if frame[0] == 0x9:
                call.pings += 1
            elif frame[1] == bytes([CLOSE, STDIN]):
                call.stdin_closed = True


# --- nodes and pods that change over time (trainctl scale) ----------------------------------------


def node_object(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    allocatable: dict[str, str] | None = None,
    taints: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"taints": list(taints)} if taints else {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "kubelet is posting ready status" if ready else "container runtime network not ready",
                }
            ],
            "allocatable": {"cpu": "190", "memory": "2000Gi", "pods": "100", **(allocatable or {})},
        },
    }


def daemon_pod_object(
    name: str,
    *,
    node: str,
    labels: dict[str, str],
    namespace: str = "kube-system",
    ready: bool = True,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    """A DaemonSet pod for `node`: pinned by node affinity on metadata.name, as the DaemonSet controller
    does; bound (nodeName) unless `unschedulable` is the scheduler's message."""
    spec: dict[str, Any] = {
        "containers": [{"name": "plugin", "image": "plugin:test"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        },
    }
    if unschedulable is None:
        spec["nodeName"] = node
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
        phase = "Running"
    else:
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}]
        phase = "Pending"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
        "status": {"phase": phase, "conditions": conditions},
    }


class ClusterKube(FakeKube):
    """FakeKube that also serves `GET /api/v1/nodes` and `GET /api/v1/pods` (all namespaces), both with
    label selectors, from `script(poll)`: poll counts the node lists served so far (0 for the first),
    and the script returns (nodes, pods) as they are at that poll, so a test can make them change."""

    def __init__(self, script: Callable[[int], tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> None:
        super().__init__()
        self.script = script
        self.node_polls = 0
        self._loop.server.RequestHandlerClass = _ClusterHandler

    def state(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.script(max(0, self.node_polls - 1))


class _ClusterHandler(_Handler):
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path not in ("/api/v1/nodes", "/api/v1/pods"):
            return super().do_GET()
        fake = self.fake
        assert isinstance(fake, ClusterKube)
        query = parse_qs(url.query, keep_blank_values=True)
        fake.record(Recorded("GET", url.path, query, self.headers.get("Authorization")))
        selector = query.get("labelSelector", [""])[0]
        try:
            if url.path == "/api/v1/nodes":
                with fake._lock:
                    fake.node_polls += 1
                nodes, _ = fake.state()
                items, kind = [n for n in nodes if matches(n["metadata"]["labels"], selector)], "NodeList"
            else:
                _, pods = fake.state()
                items, kind = [p for p in pods if matches(p["metadata"]["labels"], selector)], "PodList"
            self._json(200, {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})
        except Exception as exc:
            fake.handler_errors.append(f"{type(exc).__name__}: {exc}")
            raise

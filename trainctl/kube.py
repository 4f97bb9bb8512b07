"""Kubernetes pieces of trainctl: Ray pods by label, commands in a pod over the exec API, and the
working directory as a tar stream (what `kubectl get -l`, `kubectl exec` and `kubectl cp` do).

Nothing is port-forwarded or exposed: every Ray API call (port 8265) is made from inside the
head pod, through `exec`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import select
import ssl
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HEAD = "head"
WORKER = "worker"
NODE_TYPE_LABEL = "ray.io/node-type"
CLUSTER_LABEL = "ray.io/cluster"
"""Labels KubeRay puts on every pod of a RayCluster (head: ray.io/node-type=head)."""

STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
"""Channels of the exec WebSocket (v4.channel.k8s.io; v5 adds CLOSE to end one channel)."""
V5_PROTOCOL = "v5.channel.k8s.io"
STDIN_CHUNK = 64 * 1024
POLL_S = 0.5
KEEPALIVE_S = 30.0
"""A WebSocket ping after this much silence, so load balancers keep a quiet stream open."""
IDLE_REPORT_S = 60.0

UPLOAD_ROOT = "/tmp/trainctl"
DEFAULT_EXCLUDES = (".git", "__pycache__", ".venv")
DEFAULT_UPLOAD_LIMIT_MIB = 100
RAY_WORKING_DIR_LIMIT_MIB = 500
"""Ray refuses a working_dir package larger than this."""
MIB = 1024 * 1024
# `head -c N` ends stdin after the archive: the v4 protocol cannot close stdin, and tar
# would wait for more. -m: no mtimes from the archive (as kubectl cp extracts).
UPLOAD_SCRIPT = 'set -e; rm -rf -- "$1"; mkdir -p -- "$1"; head -c "$2" | tar -xzmf - -C "$1"'


class KubeError(Exception):
    """The API server could not be reached, refused, or the pods are not as needed."""


# --- API errors -------------------------------------------------------------------------------


@contextlib.contextmanager
def api_errors(what: str) -> Iterator[None]:
    """ApiException and connection errors as KubeError saying what failed and what to check."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        raise KubeError(f"{what}: {_api_reason(exc)}") from None
    except (HTTPError, OSError) as exc:
        raise KubeError(
            f"{what}: cannot reach the API server ({exc}); a private EKS endpoint answers only inside its VPC"
        ) from None


def _api_reason(exc: Any) -> str:
    status = getattr(exc, "status", 0)
    message = ""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = json.loads(exc.body).get("message", "")
    return _reason(status, message or str(getattr(exc, "reason", "") or exc))


def _handshake_reason(exc: BaseException) -> str:
    """Why the exec WebSocket was refused, from the handshake error somewhere in the exception's chain
    (the kubernetes client wraps it, and in some versions fails on it with an AttributeError)."""
    seen: BaseException | None = exc
    while seen is not None:
        status = getattr(seen, "status_code", None)
        if isinstance(status, int):
            body: Any = getattr(seen, "resp_body", None)
            message = ""
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                message = json.loads(body).get("message", "")
            return _reason(status, message or f"handshake refused with HTTP {status}")
        seen = seen.__cause__ or seen.__context__
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


def _reason(status: int, message: str) -> str:
    if status == 401:
        return (
            f"401 Unauthorized ({message}): the token was refused; is your IAM principal one of the cluster's "
            "access entries (ClusterConfig.admin_principals)?"
        )
    if status == 403:
        return f"403 Forbidden ({message})"
    if status == 404:
        return f"404 Not Found ({message})"
    return f"{status} {message}" if status else message


# --- pods -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    phase: str
    containers: tuple[str, ...]
    node: str | None = None
    ray_cluster: str | None = None
    terminating: bool = False

    @property
    def container(self) -> str:
        """The Ray container: KubeRay requires it to be the first one."""
        return self.containers[0]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def describe(self) -> str:
        state = self.phase + (", terminating" if self.terminating else "")
        return f"{self.name} ({state}, cluster {self.ray_cluster or '-'}, node {self.node or '-'})"


def ray_selector(node_type: str, ray_cluster: str) -> str:
    """The label selector of a Ray cluster's head or workers ('' cluster: any cluster)."""
    return f"{NODE_TYPE_LABEL}={node_type}" + (f",{CLUSTER_LABEL}={ray_cluster}" if ray_cluster else "")


def _pod(item: Any) -> Pod:
    metadata, spec, status = item.metadata, item.spec, item.status
    labels = metadata.labels or {}
    return Pod(
        name=metadata.name,
        namespace=metadata.namespace,
        phase=(status.phase if status is not None else None) or "Unknown",
        containers=tuple(c.name for c in (spec.containers or [])),
        node=spec.node_name,
        ray_cluster=labels.get(CLUSTER_LABEL),
        terminating=metadata.deletion_timestamp is not None,
    )


def list_pods(api: Any, namespace: str, selector: str, *, timeout: float) -> list[Pod]:
    from kubernetes import client

    with api_errors(f"list pods -l {selector} in namespace {namespace}"):
        items = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector, _request_timeout=timeout)
    return sorted((_pod(item) for item in items.items), key=lambda p: p.name)


def find_head_pod(api: Any, namespace: str, ray_cluster: str, *, timeout: float) -> Pod:
    """The one Running Ray head pod; KubeError listing what was found otherwise."""
    selector = ray_selector(HEAD, ray_cluster)
    pods = list_pods(api, namespace, selector, timeout=timeout)
    running = [p for p in pods if p.phase == "Running" and not p.terminating and p.containers]
    if len(running) == 1:
        return running[0]
    where = f"namespace {namespace} (-l {selector})"
    if not running:
        found = "; found: " + ", ".join(p.describe() for p in pods) if pods else ""
        hint = f" Is the RayCluster deployed and up? kubectl get raycluster -n {namespace}" + (
            "; pick another with --ray-cluster" if ray_cluster else ""
        )
        raise KubeError(f"no Running Ray head pod in {where}{found}.{hint}")
    raise KubeError(
        f"{len(running)} Running Ray head pods in {where}: "
        + ", ".join(p.describe() for p in running)
        + ". Choose one cluster with --ray-cluster NAME"
    )


def get_pod(api: Any, namespace: str, name: str, *, timeout: float) -> Pod:
    from kubernetes import client

    with api_errors(f"get pod {namespace}/{name}"):
        item = client.CoreV1Api(api).read_namespaced_pod(name, namespace, _request_timeout=timeout)
    return _pod(item)


def pod_log(
    api: Any, pod: Pod, container: str, *, follow: bool = False, previous: bool = False, timeout: float
) -> Iterator[bytes]:
    """The container's log as it arrives (`kubectl logs [-f] [-p]`); a follow has no read timeout."""
    from kubernetes import client

    what = f"logs of {pod} container {container}"
    with api_errors(what):
        response = client.CoreV1Api(api).read_namespaced_pod_log(
            pod.name,
            pod.namespace,
            container=container,
            follow=follow,
            previous=previous,
            _preload_content=False,
            _request_timeout=(timeout, None) if follow else timeout,
        )
    try:
        with api_errors(what):
            yield from response.stream(64 * 1024, decode_content=True)
    finally:
        response.release_conn()


# --- exec -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    """None: the command did not run to an exit status (could not start, or the stream broke)."""
    message: str
    """The API server's status message when the command failed or could not run."""
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def why(self) -> str:
        """One line on why it failed: its stderr's last line, or the status message."""
        tail = self.stderr.decode(errors="replace").strip().splitlines()
        detail = tail[-1] if tail else self.message
        return detail or f"exit code {self.exit_code}"


def parse_status(raw: bytes) -> tuple[int | None, str]:
    """(exit code, message) from the exec status (a metav1.Status on the error channel)."""
    if not raw.strip():
        return None, "the exec stream ended without an exit status"
    try:
        document = json.loads(raw)
    except ValueError:
        return None, raw.decode(errors="replace").strip()
    if not isinstance(document, dict):
        return None, raw.decode(errors="replace").strip()
    if document.get("status") == "Success":
        return 0, ""
    message = str(document.get("message") or "")
    for cause in (document.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message")), message
    return None, message or str(document.get("reason") or "the command failed to run")


def _readable(sock: Any, timeout: float) -> bool:
    raw = sock.sock
    if isinstance(raw, ssl.SSLSocket) and raw.pending():
        return True  # decrypted bytes already buffered: select would not see them
    ready, _, _ = select.select([raw], [], [], timeout)
    return bool(ready)


OnData = Callable[[bytes], None]
OnIdle = Callable[[float, float], None]
"""(seconds since the command started, seconds since its last output)."""


def exec_in_pod(
    api: Any,
    pod: Pod,
    command: Sequence[str],
    *,
    stdin: IO[bytes] | None = None,
    on_stdout: OnData | None = None,
    on_stderr: OnData | None = None,
    capture: bool = True,
    on_idle: OnIdle | None = None,
    idle_s: float = IDLE_REPORT_S,
    keepalive_s: float = KEEPALIVE_S,
) -> ExecResult:
    """Run `command` in the pod's Ray container, as `kubectl exec -i` does, and wait for it.

    Output is handed to `on_stdout`/`on_stderr` as it arrives (and kept when `capture`);
    `stdin` is sent first, then the output is read until the API server closes the stream.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream
    from websocket import ABNF, WebSocketException

    try:
        ws = stream(
            client.CoreV1Api(api).connect_get_namespaced_pod_exec,
            pod.name,
            pod.namespace,
            container=pod.container,
            command=list(command),
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )
    except (ApiException, AttributeError) as exc:
        raise KubeError(f"exec in pod {pod}: {_handshake_reason(exc)}") from None
    sock = ws.sock
    out, err, status = bytearray(), bytearray(), bytearray()
    started = last_output = last_traffic = last_idle = time.monotonic()
    try:
        if stdin is not None:
            with contextlib.suppress(WebSocketException, OSError):
                while chunk := stdin.read(STDIN_CHUNK):
                    sock.send(bytes([STDIN]) + chunk, ABNF.OPCODE_BINARY)
                if ws.subprotocol == V5_PROTOCOL:
                    sock.send(bytes([CLOSE, STDIN]), ABNF.OPCODE_BINARY)
        while sock.connected:
            if not _readable(sock, POLL_S):
                now = time.monotonic()
                if now - last_traffic >= keepalive_s:
                    with contextlib.suppress(WebSocketException, OSError):
                        sock.ping()
                    last_traffic = now
                if on_idle is not None and now - max(last_output, last_idle) >= idle_s:
                    on_idle(now - started, now - last_output)
                    last_idle = now
                continue
            try:
                opcode, frame = sock.recv_data_frame(True)
            except (WebSocketException, OSError):
                break
            last_traffic = time.monotonic()
            if opcode == ABNF.OPCODE_CLOSE:
                break
            if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT):
                continue
            data = frame.data.encode() if isinstance(frame.data, str) else bytes(frame.data)
            if len(data) < 2:
                continue  # the empty frame that opens a channel
            channel, payload = data[0], data[1:]
            if channel == STDOUT:
                last_output = last_traffic
                if capture:
                    out += payload
                if on_stdout is not None:
                    on_stdout(payload)
            elif channel == STDERR:
                last_output = last_traffic
                if capture:
                    err += payload
                if on_stderr is not None:
                    on_stderr(payload)
            elif channel == ERROR:
                status += payload
    finally:
        with contextlib.suppress(Exception):
            if sock.connected:
                sock.close(timeout=1)
        with contextlib.suppress(Exception):
            sock.shutdown()
    code, message = parse_status(bytes(status))
    return ExecResult(code, message, bytes(out), bytes(err))


# --- the working directory --------------------------------------------------------------------


class WorkingDirError(Exception):
    """The working directory cannot be sent: missing, unreadable, or over the size limit."""


@dataclass
class Archive:
    """The working directory as a gzip'ed tar in a temporary file."""

    file: IO[bytes]
    size: int
    """Bytes of the compressed archive (what goes over the wire)."""
    files: int
    content_bytes: int
    """Bytes of the files in it, uncompressed (what the limit is about)."""

    def close(self) -> None:
        self.file.close()


def _excluded(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _walk(root: Path, excludes: Sequence[str]) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under root (directories, regular files, symlinks), excluded names pruned, in order."""
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(directory)
        dirnames[:] = sorted(d for d in dirnames if not _excluded(d, excludes))
        for name in sorted([*dirnames, *(f for f in filenames if not _excluded(f, excludes))]):
            path = base / name
            try:
                info = path.lstat()
            except OSError as exc:
                raise WorkingDirError(f"cannot read {path}: {exc.strerror or exc}") from None
            if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
                yield path, info


def human_size(size: float) -> str:
    if size < 1024:
        return f"{size:.0f} B"
    if size < MIB:
        return f"{size / 1024:.1f} KiB"
    return f"{size / MIB:.1f} MiB"


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_working_dir(
    root: Path, *, excludes: Sequence[str] = DEFAULT_EXCLUDES, limit_bytes: int = DEFAULT_UPLOAD_LIMIT_MIB * MIB
) -> Archive:
    """The directory as a tar.gz (names relative to it), or WorkingDirError if it is over the limit."""
    if not root.is_dir():
        raise WorkingDirError(f"--working-dir {root} is not a directory")
    entries = list(_walk(root, excludes))
    sizes: dict[str, int] = {}
    for path, info in entries:
        if stat.S_ISREG(info.st_mode):
            top = path.relative_to(root).parts[0]
            sizes[top] = sizes.get(top, 0) + info.st_size
    total = sum(sizes.values())
    if total > limit_bytes:
        largest = sorted(sizes.items(), key=lambda item: -item[1])[:3]
        listed = ", ".join(f"{name} ({human_size(size)})" for name, size in largest)
        raise WorkingDirError(
            f"--working-dir {root} holds {human_size(total)} of files, over the limit of {human_size(limit_bytes)} "
            f"(largest: {listed}). Leave data and checkpoints out (--exclude NAME; always excluded: "
            f"{', '.join(DEFAULT_EXCLUDES)}), read them from shared storage instead, or raise --max-upload-mib "
            f"(Ray refuses more than {RAY_WORKING_DIR_LIMIT_MIB} MiB)"
        )
    # Returned open inside the Archive; its owner closes it (Archive.close).
    spool: IO[bytes] = tempfile.TemporaryFile(prefix="trainctl-workdir-")  # noqa: SIM115
    try:
        with tarfile.open(fileobj=spool, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=6) as tar:
            for path, _ in entries:
                tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False, filter=_anonymous)
        size = spool.tell()
        spool.seek(0)
    except OSError as exc:
        spool.close()
        raise WorkingDirError(f"cannot pack {root}: {exc.strerror or exc}") from None
    files = sum(1 for _, info in entries if not stat.S_ISDIR(info.st_mode))
    return Archive(spool, size, files, total)


def upload_command(dest: str, size: int) -> list[str]:
    """What runs in the pod to receive an archive of `size` bytes on stdin into `dest`."""
    return ["sh", "-c", UPLOAD_SCRIPT, "trainctl-upload", dest, str(size)]


def remove_command(dest: str) -> list[str]:
    return ["rm", "-rf", "--", dest]


def upload(api: Any, pod: Pod, archive: Archive, dest: str) -> None:
    """Unpack the archive into `dest` in the pod (replacing what was there); KubeError if it fails."""
    archive.file.seek(0)
    result = exec_in_pod(api, pod, upload_command(dest, archive.size), stdin=archive.file)
    if not result.ok:
        raise KubeError(f"copying the working directory to {pod}:{dest} failed: {result.why()}")

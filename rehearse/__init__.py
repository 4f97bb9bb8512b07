"""`trainctl rehearse`: run Kubernetes manifests as isolated pods on this Linux machine, on CPU.

The seam shared by the CLI and the tests is `run(manifests, options) -> Rehearsal`: manifests are
parsed objects (see `load_manifests`), the result holds one outcome per workload (Job, RayJob,
RayCluster) with its pods. The pod runtime is rehearse/pods.py (namespaces, volumes, DNS)
with podinit.py inside each pod and network.py for addresses; the controllers are jobs.py (batch/v1)
and kuberay.py (KubeRay v1.7.0).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from rehearse.jobs import JobController
from rehearse.kuberay import RayClusterController, RayJobController, dashboard_dependency_error
from rehearse.network import Network, open_network
from rehearse.pods import Pod, PodSetupError, Runtime, accelerator_requests

WORKLOAD_KINDS = ("Job", "RayJob", "RayCluster")
HONOURED_KINDS = ("Service", "ConfigMap", "PersistentVolumeClaim")
_KILL = re.compile(r"^(?P<pod>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)@(?P<seconds>\d+(\.\d+)?)$")


class RehearsalError(Exception):
    """The rehearsal could not run (exit 2): not Linux, no namespaces, bad YAML, an unusable manifest."""


class Controller(Protocol):
    kind: str
    name: str
    namespace: str
    pods: list[Pod]
    started: float
    finished: float | None

    @property
    def done(self) -> bool: ...

    def start(self, runtime: Runtime) -> None: ...

    def on_pod_end(self, runtime: Runtime, pod: Pod) -> None: ...

    def tick(self, runtime: Runtime) -> None: ...

    def state(self) -> tuple[str, str]: ...


@dataclass(frozen=True, kw_only=True)
class Kill:
    """Kill the first running pod whose name or hostname starts with `pod`, `seconds` into the run, or (API
    only) `seconds` after the path `after` (relative to the output directory, e.g. a committed checkpoint on a
    claim: `claims/<ns>/<claim>/...`) first exists, so a test can lose a node at a point of the training."""

    pod: str
    seconds: float
    after: Path | None = None

    @classmethod
    def parse(cls, text: str) -> Kill:
        m = _KILL.match(text)
        if not m:
            raise RehearsalError(f"--kill {text!r}: write it as POD@SECONDS, e.g. nvrx-fsdp-1@30")
        return cls(pod=m.group("pod"), seconds=float(m.group("seconds")))


@dataclass(frozen=True, kw_only=True)
class Options:
    output_dir: Path | None = None
    timeout_s: float = 1800.0
    kills: tuple[Kill, ...] = ()
    # Kubernetes delays the pod that replaces a counted failure by 10 s, doubling (capped at 6 min).
    backoff_base_s: float = 10.0
    # Host directories every pod sees read-only at the same path (standing in for files in the image).
    host_paths: tuple[Path, ...] = ()
    log: Callable[[str], None] | None = None
    # "auto": a private bridge network where the machine allows it, else the loopback fallback (network.py);
    # "loopback": the fallback even where the bridge works.
    network: str = "auto"

    def __post_init__(self) -> None:
        if self.network not in ("auto", "loopback"):
            raise RehearsalError(f"network={self.network!r}: use 'auto' or 'loopback'")
        if self.timeout_s <= 0:
            raise RehearsalError(f"timeout={self.timeout_s}: must be positive")
        if self.backoff_base_s < 0:
            raise RehearsalError(f"backoff_base_s={self.backoff_base_s}: must be 0 or more")
        for path in self.host_paths:
            if not Path(path).exists():
                raise RehearsalError(f"host path {path} does not exist")


@dataclass
class PodOutcome:
    name: str
    uid: str
    labels: dict[str, str]
    hostname: str
    address: str
    images: list[str]
    phase: str
    exit_codes: dict[str, int | None]
    restarts: int
    conditions: list[dict[str, str]]
    accelerators: dict[str, str]
    wall_s: float
    directory: Path
    pod: Pod = field(repr=False)

    def log(self, container: str | None = None) -> str:
        return self.pod.log(container)


@dataclass
class WorkloadOutcome:
    kind: str
    name: str
    namespace: str
    state: str
    message: str
    wall_s: float
    pods: list[PodOutcome]
    notes: list[str]
    # The uid the apiserver would give the object (Jobs; empty where the rehearsal models none).
    uid: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state in ("Complete", "Ready")

    def pod(self, prefix: str) -> PodOutcome:
        found = [p for p in self.pods if p.name.startswith(prefix) or p.hostname == prefix]
        if not found:
            raise KeyError(f"no pod {prefix!r} in {self.kind}/{self.name}: {[p.name for p in self.pods]}")
        return found[-1]


@dataclass
class Rehearsal:
    workloads: list[WorkloadOutcome]
    network: str
    notes: list[str]
    output_dir: Path
    wall_s: float

    @property
    def exit_code(self) -> int:
        return 0 if all(w.succeeded for w in self.workloads) else 1

    def workload(self, name: str) -> WorkloadOutcome:
        for w in self.workloads:
            if w.name == name:
                return w
        raise KeyError(f"no workload {name!r}: {[w.name for w in self.workloads]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "notes": self.notes,
            "output_dir": str(self.output_dir),
            "wall_s": round(self.wall_s, 2),
            "exit_code": self.exit_code,
            "workloads": [
                {
                    "kind": w.kind,
                    "name": w.name,
                    "namespace": w.namespace,
                    "uid": w.uid,
                    "state": w.state,
                    "message": w.message,
                    "wall_s": round(w.wall_s, 2),
                    "notes": w.notes,
                    "pods": [
                        {
                            "name": p.name,
                            "uid": p.uid,
                            "labels": p.labels,
                            "hostname": p.hostname,
                            "address": p.address,
                            "images": p.images,
                            "phase": p.phase,
                            "exit_codes": p.exit_codes,
                            "restarts": p.restarts,
                            "conditions": p.conditions,
                            "accelerators_not_satisfied": p.accelerators,
                            "wall_s": round(p.wall_s, 2),
                            "logs": str(p.directory),
                        }
                        for p in w.pods
                    ],
                }
                for w in self.workloads
            ],
        }


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every object of the YAML files (multi-document), or RehearsalError naming the file."""
    objects: list[dict[str, Any]] = []
    for path in paths:
        try:
            docs = list(yaml.safe_load_all(Path(path).read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise RehearsalError(f"{path}: cannot read Kubernetes YAML: {exc}") from exc
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
                raise RehearsalError(f"{path}: a document is not a Kubernetes object (needs kind and metadata)")
            objects.append(doc)
    return objects


def check_platform() -> None:
    """RehearsalError unless this machine can make the namespaces a pod needs."""
    if not sys.platform.startswith("linux"):
        raise RehearsalError(f"rehearsal needs Linux namespaces; this is {sys.platform}")
    if shutil.which("unshare") is None:
        raise RehearsalError("rehearsal needs util-linux `unshare` on PATH")
    probe = subprocess.run(
        ["unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise RehearsalError(
            "cannot create mount/PID/UTS namespaces (run as root, or enable unprivileged user namespaces): "
            + probe.stderr.strip()
        )


def _namespaced(obj: dict[str, Any]) -> dict[str, Any]:
    obj.setdefault("metadata", {}).setdefault("namespace", "default")
    return obj


def _controller(obj: dict[str, Any], options: Options) -> Controller:
    kind = obj["kind"]
    try:
        if kind == "Job":
            return JobController(obj, backoff_base_s=options.backoff_base_s)
        if kind == "RayJob":
            return RayJobController(obj, backoff_base_s=options.backoff_base_s)
        return RayClusterController(obj)
    except (KeyError, ValueError, TypeError) as exc:
        raise RehearsalError(f"{kind}/{obj['metadata'].get('name')}: cannot rehearse: {exc!r}") from exc


def _outcome(controller: Controller) -> WorkloadOutcome:
    state, message = controller.state()
    now = time.monotonic()
    pods = [
        PodOutcome(
            name=p.name,
            uid=p.plan.uid,
            labels=dict(p.plan.labels),
            hostname=p.plan.pod_hostname,
            address=p.address,
            images=p.images,
            phase=p.phase,
            exit_codes=dict(p.exit_codes),
            restarts=p.restarts,
            conditions=list(p.conditions),
            accelerators=accelerator_requests(p.plan.spec),
            wall_s=(p.ended or now) - p.started,
            directory=p.directory,
            pod=p,
        )
        for p in controller.pods
    ]
    notes = list(getattr(controller, "notes", []))
    return WorkloadOutcome(
        kind=controller.kind,
        name=controller.name,
        namespace=controller.namespace,
        state=state,
        message=message,
        wall_s=(controller.finished or now) - controller.started,
        pods=pods,
        notes=sorted(set(notes)),
        uid=str(getattr(controller, "uid", "")),
    )


def run(manifests: Sequence[dict[str, Any]], options: Options | None = None) -> Rehearsal:
    """Runs every workload of `manifests` at once, as `kubectl apply` of them would, to the end."""
    options = options or Options()
    check_platform()
    objects = [_namespaced(dict(o)) for o in manifests]
    notes = [
        f"skipped {o['kind']}/{o['metadata'].get('name')}: not run by the rehearsal"
        for o in objects
        if o["kind"] not in (*WORKLOAD_KINDS, *HONOURED_KINDS, "Namespace")
    ]
    workloads = [o for o in objects if o["kind"] in WORKLOAD_KINDS]
    if not workloads:
        raise RehearsalError("nothing to rehearse: no Job, RayJob or RayCluster in the files")
    configmaps = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): {k: str(v) for k, v in (o.get("data") or {}).items()}
        for o in objects
        if o["kind"] == "ConfigMap"
    }
    services = [o for o in objects if o["kind"] == "Service"]
    ray_workloads = [f"{o['kind']}/{o['metadata'].get('name')}" for o in workloads if o["kind"] != "Job"]
    if ray_workloads:
        missing = dashboard_dependency_error()
        if missing:
            raise RehearsalError(f"cannot rehearse {', '.join(ray_workloads)}: {missing}")
    controllers = [_controller(o, options) for o in workloads]
    for c in controllers:
        services += list(getattr(c, "services", []))
    output_dir = options.output_dir or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    output_dir.mkdir(parents=True, exist_ok=True)
    network, fallback = open_network(loopback=options.network == "loopback")
    if fallback:
        notes.append(fallback)
    log = options.log or (lambda _: None)
    runtime = Runtime(
        output_dir=output_dir,
        network=network,
        configmaps=configmaps,
        services=services,
        host_paths=options.host_paths,
        log=log,
    )
    started = time.monotonic()
    pending_kills = sorted(options.kills, key=lambda k: k.seconds)
    kill_clock: dict[Kill, float] = {}
    owner: dict[str, Controller] = {}
    try:
        try:
            for c in controllers:
                c.start(runtime)
        except PodSetupError as exc:
            raise RehearsalError(str(exc)) from exc
        while not all(c.done for c in controllers):
            elapsed = time.monotonic() - started
            if elapsed > options.timeout_s:
                notes.append(f"timed out after {options.timeout_s:g} s; running pods were killed")
                break
            for c in controllers:
                for p in c.pods:
                    owner[p.name] = c
            for kill in pending_kills:
                if kill not in kill_clock and (kill.after is None or (output_dir / kill.after).exists()):
                    kill_clock[kill] = elapsed
            due = [k for k in pending_kills if k in kill_clock and elapsed - kill_clock[k] >= k.seconds]
            for kill in due:
                pending_kills.remove(kill)
                target = next(
                    (
                        p
                        for p in runtime.pods.values()
                        if p.running and (p.name.startswith(kill.pod) or p.plan.pod_hostname == kill.pod)
                    ),
                    None,
                )
                if target is None:
                    notes.append(f"--kill {kill.pod}@{kill.seconds:g}: no running pod matched")
                    continue
                log(f"killing pod {target.name} at {elapsed:.1f} s (DisruptionTarget)")
                notes.append(f"killed pod {target.name} at {elapsed:.1f} s")
                runtime.kill(target, disruption="DeletionByPodGC")
                owner[target.name].on_pod_end(runtime, target)
            for pod in runtime.poll():
                log(f"pod {pod.name} ended: {pod.phase} {pod.exit_codes}")
                owner[pod.name].on_pod_end(runtime, pod)
            for c in controllers:
                c.tick(runtime)
            time.sleep(0.1)
    finally:
        runtime.close()
        network.close()
    outcomes = [_outcome(c) for c in controllers]
    for outcome in outcomes:
        if outcome.state in ("Running", "Pending", "Initializing"):
            outcome.state = "Timeout"
    return Rehearsal(
        workloads=outcomes,
        network=network.kind,
        notes=notes,
        output_dir=output_dir,
        wall_s=time.monotonic() - started,
    )


def format_table(rehearsal: Rehearsal) -> str:
    """One table per workload: pods, address, exit codes, restarts, final state, wall time."""
    out = [f"network: {rehearsal.network}; logs under {rehearsal.output_dir}/pods/<pod>/"]
    out += [f"note: {n}" for n in rehearsal.notes]
    for w in rehearsal.workloads:
        out.append("")
        out.append(f"{w.kind}/{w.name} ({w.namespace}): {w.state} in {w.wall_s:.1f} s  {w.message}".rstrip())
        out += [f"  note: {n}" for n in w.notes]
        rows = [("POD", "ADDRESS", "EXIT CODES", "RESTARTS", "STATE", "WALL S", "IMAGE / NOT SATISFIED")]
        for p in w.pods:
            codes = ",".join(f"{k}={v}" for k, v in p.exit_codes.items())
            extra = " ".join(f"{k}={v}" for k, v in p.accelerators.items())
            state = p.phase + ("/" + ",".join(c["type"] for c in p.conditions) if p.conditions else "")
            rows.append((p.name, p.address, codes, str(p.restarts), state, f"{p.wall_s:.1f}", f"{p.images[0]} {extra}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            out.append("  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:-1])) + "  " + r[-1])
    return "\n".join(out)


__all__ = [
    "Kill",
    "Network",
    "Options",
    "PodOutcome",
    "Rehearsal",
    "RehearsalError",
    "WorkloadOutcome",
    "check_platform",
    "format_table",
    "load_manifests",
    "run",
]

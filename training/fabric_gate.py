"""The fabric gate: a multi-node job proves its own gang's EFA before step 1, finds the node at fault, takes it out.

    python -m training.fabric_gate judge --instance-type p5.48xlarge --nodes 2 [--busbw 437.8] [--json] LOG...
    python -m training.fabric_gate supervise [--verdict-file F] -- ft_launcher ...

In a job (`--fabric-gate` on training/nvrx_fsdp.py and training/ray_finetune.py; every emitted multi-node GPU
workload sets it), after the process group is up and before the first step:

1. a short all-reduce sweep over the job's own ranks, up to the floor's message size (infra/spec/fabric_floors.py,
   passed in as flags: this module ships to the pods and imports nothing of infra/), within a time budget;
2. each rank reads the NCCL log its own process wrote (NCCL_DEBUG_FILE, NCCL_DEBUG=INFO) and judges its transport
   with training/fabric_analyzer.py; the per-rank records are gathered, and `decide` gives one verdict per job:
   PASS, FAIL (a rank off EFA, or bus bandwidth under the floor at the floor's size), UNKNOWN (not enough evidence);
3. on FAIL the node at fault is looked for: a rank off EFA names its node; a bandwidth failure on 3 or more nodes is
   narrowed by pairwise tests (`next_pairs`/`conclude`: the nodes that fail every pair), on 2 nodes by per-node
   checks (EFA devices and ports under /sys/class/infiniband, an intra-node all-reduce: `judge_two_nodes`);
4. rank 0 taints the suspect node(s) (`platform/fabric-gate`, NoSchedule) through the pod's service-account token
   (an identity a ValidatingAdmissionPolicy lets change that taint and nothing else, k8s/charts/fabric_gate.py),
   posts Kubernetes Events on each suspect node and on the workload, emits an EMF line (training/emf.py), and every
   pod writes the verdict to its termination message; then every rank exits with EXIT_RETRY (the Job's
   podFailurePolicy ignores it: the pods are recreated away from the tainted node) or, after `max_failures` gate
   failures of the same run (or an UNKNOWN verdict, which no other node can fix), EXIT_FAILED (FailJob).

On a CPU rehearsal (training/rehearsal.py) there is no NCCL and the gate reports NOT RUN with that reason. There
only, FABRIC_GATE_INJECT=fallback:NODE or slow:NODE fakes the verdict of one node (a socket transport, or pairs
with that node under the floor) over gloo, so the taint-and-requeue path can be rehearsed without GPUs, and
FABRIC_GATE_API_URL (+ FABRIC_GATE_API_TOKEN) names the rehearsal's API server instead of the in-cluster one.

Standard library and torch only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from training import emf
from training.fabric_analyzer import FabricReport, Verdict, analyze_paths
from training.fabric_gate_config import Floor as Floor  # re-exported: the gate's callers name it here
from training.fabric_gate_config import GateConfig as GateConfig
from training.fabric_gate_config import human_bytes
from training.rehearsal import cpu_rehearsal

# Pod exit codes (k8s/charts/nvrx_job.py's podFailurePolicy names both). Not 1 (ft_launcher's own failure), not 2
# (bad arguments, FailJob), not 3/4/6/10 (the fabric probe and check), not 128+N (signals).
EXIT_RETRY = 75
"""The gate failed and the suspect node is tainted: recreate the pods elsewhere (podFailurePolicy Ignore)."""
EXIT_FAILED = 76
"""The gate failed `max_failures` times for this run, or cannot decide: fail the job with the verdict (FailJob)."""

# Judge mode exit codes.
JUDGE_PASS, JUDGE_FAIL, JUDGE_BAD_INPUT, JUDGE_UNKNOWN = 0, 1, 2, 3

TAINT_KEY = "platform/fabric-gate"
TAINT_EFFECT = "NoSchedule"
EVENT_REASON = "FabricGateFailed"
SERVICE_ACCOUNT = "fabric-gate"
# A cluster-scoped object's core/v1 Events (no eventTime) must be in namespace "default" (or ""): the API server
# refuses any other (pkg/apis/core/validation/events.go legacyValidateEvent, Kubernetes 1.36), and client-go's
# recorder puts a Node's Events there too.
NODE_EVENT_NAMESPACE = "default"

# Set on gated pods by the charts (k8s/charts/fabric_gate.py gate_env); the defaults keep local runs working.
NODE_NAME_ENV = "NODE_NAME"
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
POD_DIR_ENV = "FABRIC_GATE_POD_DIR"
TERMINATION_LOG_ENV = "FABRIC_GATE_TERMINATION_LOG"
RUN_ID_ENV = "FABRIC_GATE_RUN_ID"
INJECT_ENV = "FABRIC_GATE_INJECT"
API_URL_ENV = "FABRIC_GATE_API_URL"
API_TOKEN_ENV = "FABRIC_GATE_API_TOKEN"
NCCL_DEBUG_FILE_ENV = "NCCL_DEBUG_FILE"
DEFAULT_POD_DIR = "/tmp/fabric-gate"
DEFAULT_NCCL_LOG = f"{DEFAULT_POD_DIR}/nccl.%h.%p.log"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4096
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A sweep of the rehearsal (gloo on CPU) uses small messages: its bandwidth means nothing, its mechanics do.
REHEARSAL_MESSAGE_BYTES = 1 << 20
EMF_FAILED = emf.FABRIC_GATE_FAILED
EMF_SECONDS = emf.FABRIC_GATE_SECONDS
EMF_BUSBW = emf.FABRIC_GATE_BUSBW
EMF_DIMENSIONS = emf.FABRIC_GATE_DIMENSIONS


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"
    NOT_RUN = "NOT RUN"


JUDGE_EXIT = {Outcome.PASS: JUDGE_PASS, Outcome.FAIL: JUDGE_FAIL, Outcome.UNKNOWN: JUDGE_UNKNOWN}


# --- the decision -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bandwidth:
    message_bytes: int
    busbw_gbps: float


@dataclass(frozen=True)
class RankTransport:
    """One rank's transport, from its own NCCL log (training/fabric_analyzer.py)."""

    rank: int | None
    host: str
    node: str
    verdict: str
    reason: str

    @property
    def fell_back(self) -> bool:
        return self.verdict in (Verdict.SOCKET.value, Verdict.DEGRADED.value)


@dataclass(frozen=True)
class GateVerdict:
    outcome: Outcome
    reasons: tuple[str, ...]
    nodes: tuple[str, ...] = ()
    ranks: int = 0
    failing: tuple[RankTransport, ...] = ()
    bandwidth: Bandwidth | None = None
    floor: Floor | None = None
    bandwidth_failed: bool = False
    suspects: tuple[str, ...] = ()
    localization: str = ""
    """How the suspects were found, or why none could be."""
    seconds: float | None = None
    run_seconds: float | None = None
    """The job's configured run (its deadline), for the gate's share of it."""

    @property
    def share(self) -> float | None:
        if self.seconds is None or not self.run_seconds:
            return None
        return self.seconds / self.run_seconds

    def summary(self) -> str:
        text = f"FABRIC GATE {self.outcome.value}: " + "; ".join(self.reasons)
        if self.suspects:
            text += f"; suspect node(s): {', '.join(self.suspects)}"
        if self.localization:
            text += f" ({self.localization})"
        if self.seconds is not None:
            text += f"; cost {self.seconds:.1f} s"
            if self.share is not None:
                text += f" ({self.share:.2%} of the configured run of {self.run_seconds:g} s)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "summary": self.summary(),
            "reasons": list(self.reasons),
            "nodes": list(self.nodes),
            "ranks": self.ranks,
            "failing_ranks": [asdict(r) for r in self.failing],
            "bandwidth": None if self.bandwidth is None else asdict(self.bandwidth),
            "floor": None if self.floor is None else asdict(self.floor),
            "suspects": list(self.suspects),
            "localization": self.localization,
            "seconds": self.seconds,
            "share_of_run": self.share,
        }


def decide(
    transports: Sequence[RankTransport],
    *,
    expected_ranks: int | None,
    expected_nodes: int | None = None,
    bandwidth: Bandwidth | None,
    floor: Floor | None,
) -> GateVerdict:
    """The one decision of the gate and of judge mode. A fallback on any rank fails (naming ranks and hosts), then
    missing evidence is UNKNOWN, then the bandwidth at the floor's size decides."""
    nodes = tuple(sorted({t.node for t in transports}))
    common: dict[str, Any] = {"nodes": nodes, "ranks": len(transports), "bandwidth": bandwidth, "floor": floor}
    failing = tuple(t for t in transports if t.fell_back)
    if failing:
        named = ", ".join(f"rank {'?' if t.rank is None else t.rank} on {t.host} ({t.verdict})" for t in failing)
        return GateVerdict(
            Outcome.FAIL,
            (f"{len(failing)} of {len(transports)} rank(s) are not on EFA: {named}; {failing[0].reason}",),
            failing=failing,
            **common,
        )
    unknown = [t for t in transports if t.verdict != Verdict.EFA.value]
    if unknown:
        return GateVerdict(
            Outcome.UNKNOWN,
            (f"{len(unknown)} of {len(transports)} rank(s) have no transport evidence: {unknown[0].reason}",),
            **common,
        )
    if expected_ranks is not None and len(transports) < expected_ranks:
        return GateVerdict(
            Outcome.UNKNOWN,
            (f"too few ranks: {len(transports)} judged of the {expected_ranks} expected",),
            **common,
        )
    if expected_nodes is not None and len(nodes) < expected_nodes:
        return GateVerdict(
            Outcome.UNKNOWN,
            (f"too few nodes: ranks on {len(nodes)} host(s) of the {expected_nodes} expected",),
            **common,
        )
    on_efa = f"all {len(transports)} rank(s) on EFA"
    if bandwidth is None or floor is None:
        return GateVerdict(Outcome.PASS, (on_efa, "bandwidth not checked (no measurement or no floor)"), **common)
    measured = f"bus bandwidth {bandwidth.busbw_gbps:.2f} GB/s at {human_bytes(bandwidth.message_bytes)}"
    if bandwidth.message_bytes < floor.message_bytes:
        return GateVerdict(
            Outcome.UNKNOWN,
            (on_efa, f"{measured} is below the size the floor {floor} applies from"),
            **common,
        )
    if bandwidth.busbw_gbps < floor.busbw_gbps:
        return GateVerdict(
            Outcome.FAIL, (on_efa, f"{measured} is under the floor {floor}"), bandwidth_failed=True, **common
        )
    return GateVerdict(Outcome.PASS, (on_efa, f"{measured} meets the floor {floor}"), **common)


# --- finding the node at fault ----------------------------------------------------------------

CONFIRM = 2
"""A node is suspect once it failed pairs with this many distinct partners that passed another pair ("cleared"): one
failure with a good partner can be a flaky measurement, two are the node."""


@dataclass(frozen=True)
class PairResult:
    a: str
    b: str
    passed: bool
    busbw_gbps: float | None = None


@dataclass(frozen=True)
class Finding:
    suspects: tuple[str, ...]
    cleared: tuple[str, ...]
    undecided: tuple[str, ...]
    reason: str


def _partners(node: str, results: Iterable[PairResult]) -> list[tuple[str, bool]]:
    return [(r.b if r.a == node else r.a, r.passed) for r in results if node in (r.a, r.b)]


def _cleared(results: Sequence[PairResult]) -> set[str]:
    return {n for r in results if r.passed for n in (r.a, r.b)}


def _suspect(node: str, results: Sequence[PairResult], cleared: set[str]) -> bool:
    pairs = _partners(node, results)
    failed_with = {p for p, passed in pairs if not passed}
    return node not in cleared and len(failed_with & cleared) >= CONFIRM


def next_pairs(nodes: Sequence[str], results: Sequence[PairResult]) -> list[tuple[str, str]]:
    """The next round of disjoint node pairs to test: each node not yet cleared or suspect with a partner it has not
    been tested with, cleared partners first (a pass clears both nodes; a fail with a cleared partner accuses one)."""
    cleared = _cleared(results)
    pending = [n for n in nodes if n not in cleared and not _suspect(n, results, cleared)]
    used: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for node in pending:
        if node in used:
            continue
        tested = {p for p, _ in _partners(node, results)}
        candidates = [c for c in nodes if c != node and c not in used and c not in tested]
        candidates.sort(key=lambda c: (c not in cleared, nodes.index(c)))
        if candidates:
            pairs.append((node, candidates[0]))
            used |= {node, candidates[0]}
    return pairs


def conclude(nodes: Sequence[str], results: Sequence[PairResult]) -> Finding:
    cleared = _cleared(results)
    suspects = tuple(n for n in nodes if _suspect(n, results, cleared))
    undecided = tuple(n for n in nodes if n not in cleared and n not in suspects)
    rounds = f"{len(results)} pair test(s)"
    if suspects:
        reason = f"{rounds}: {', '.join(suspects)} failed every pair, twice with partners that passed other pairs"
    elif not cleared:
        reason = (
            f"{rounds}: every pair failed, so the fault is not one node (the network between them, or every node); "
            "no node is tainted"
        )
    elif undecided:
        reason = f"{rounds}: not enough pairs to tell about {', '.join(undecided)}"
    else:
        reason = f"{rounds}: every node passed a pair (a transient fault?)"
    return Finding(
        suspects=suspects, cleared=tuple(n for n in nodes if n in cleared), undecided=undecided, reason=reason
    )


def bisect(
    nodes: Sequence[str],
    test_pairs: Any,
    *,
    max_rounds: int = 6,
) -> tuple[Finding, list[PairResult]]:
    """Rounds of `test_pairs(pairs) -> [PairResult]` until `next_pairs` has none left or max_rounds."""
    results: list[PairResult] = []
    for _ in range(max_rounds):
        pairs = next_pairs(nodes, results)
        if not pairs:
            break
        results.extend(test_pairs(pairs))
    return conclude(nodes, results), results


@dataclass(frozen=True)
class NodeHealth:
    """A node's own checks: the EFA devices and ports it shows, and an all-reduce among its own GPUs."""

    node: str
    efa_devices: int | None
    efa_expected: int | None = None
    ports_down: tuple[str, ...] = ()
    intra_busbw_gbps: float | None = None
    counters: Mapping[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        found = []
        if self.efa_expected is not None and self.efa_devices is not None and self.efa_devices < self.efa_expected:
            found.append(f"{self.efa_devices} of {self.efa_expected} EFA devices")
        if self.ports_down:
            found.append(f"EFA port(s) not ACTIVE: {', '.join(self.ports_down)}")
        return found


INTRA_RATIO = 0.5
"""On 2 nodes, a node whose own intra-node all-reduce is under half the other's is the suspect."""


def judge_two_nodes(a: NodeHealth, b: NodeHealth) -> tuple[tuple[str, ...], str]:
    """Which of two nodes is suspect after their pair failed, from their own checks, or that it cannot tell."""
    bad = {n.node: n.problems() for n in (a, b) if n.problems()}
    if bad:
        said = "; ".join(f"{node}: {', '.join(problems)}" for node, problems in bad.items())
        return tuple(sorted(bad)), f"per-node checks: {said}"
    if a.intra_busbw_gbps and b.intra_busbw_gbps:
        low, high = sorted((a, b), key=lambda n: n.intra_busbw_gbps or 0.0)
        assert low.intra_busbw_gbps is not None
        assert high.intra_busbw_gbps is not None
        if low.intra_busbw_gbps < INTRA_RATIO * high.intra_busbw_gbps:
            return (low.node,), (
                f"per-node checks: {low.node}'s intra-node all-reduce {low.intra_busbw_gbps:.1f} GB/s is under half of "
                f"{high.node}'s {high.intra_busbw_gbps:.1f} GB/s"
            )
    return (), (
        "per-node checks cannot tell: both nodes show their EFA devices and ports and similar intra-node all-reduce; "
        "the fault is between them or not visible from either; run on 3 or more nodes to narrow it down"
    )


def read_efa(root: Path = Path("/sys/class/infiniband")) -> tuple[int | None, tuple[str, ...], dict[str, int]]:
    """(EFA devices, ports not ACTIVE, a few hw counters summed over devices) from sysfs; None when unreadable."""
    try:
        devices = sorted(p for p in root.iterdir() if p.is_dir() or p.is_symlink())
    except OSError:
        return None, (), {}
    down: list[str] = []
    counters: dict[str, int] = {}
    for device in devices:
        for port in sorted((device / "ports").glob("*")):
            with contextlib.suppress(OSError):
                state = (port / "state").read_text().strip()
                if "ACTIVE" not in state:
                    down.append(f"{device.name}/{port.name} {state}")
            for counter in ("rx_drops", "tx_bytes", "rx_bytes"):
                with contextlib.suppress(OSError, ValueError):
                    counters[counter] = counters.get(counter, 0) + int((port / "hw_counters" / counter).read_text())
    return len(devices), tuple(down), counters


# --- configuration ----------------------------------------------------------------------------


def gate_argv(
    *,
    floor_gbps: float,
    message_bytes: int,
    instance_type: str,
    state_dir: str,
    workload: str,
    efa_devices: int,
    run_seconds: int,
) -> list[str]:
    """The flags the charts put on a gated training command line."""
    return [
        "--fabric-gate",
        f"--fabric-gate-floor-gbps={floor_gbps:g}",
        f"--fabric-gate-message-bytes={message_bytes}",
        f"--fabric-gate-instance-type={instance_type}",
        f"--fabric-gate-state-dir={state_dir}",
        f"--fabric-gate-workload={workload}",
        f"--fabric-gate-efa-devices={efa_devices}",
        f"--fabric-gate-run-seconds={run_seconds}",
    ]


@dataclass(frozen=True)
class Injection:
    """A fake verdict for one node, honoured only in a CPU rehearsal (FABRIC_GATE_INJECT=fallback:NODE|slow:NODE)."""

    kind: str
    node: str


def injection(environ: Mapping[str, str] | None = None) -> Injection | None:
    values = os.environ if environ is None else environ
    text = values.get(INJECT_ENV, "")
    if not text:
        return None
    kind, sep, node = text.partition(":")
    if not sep or kind not in ("fallback", "slow") or not node:
        raise ValueError(f"{INJECT_ENV}={text!r}: use fallback:NODE or slow:NODE")
    if not cpu_rehearsal():
        raise ValueError(f"{INJECT_ENV} is honoured only in a CPU rehearsal (PLATFORM_REHEARSAL=cpu); unset it")
    return Injection(kind, node)


# --- talking to the API server ----------------------------------------------------------------


class KubeError(RuntimeError):
    pass


class KubeApi:
    """The few API calls the gate makes, over the pod's service-account token (urllib, no client library)."""

    def __init__(self, base_url: str, token: str, *, ca_file: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._context = ssl.create_default_context(cafile=ca_file) if base_url.startswith("https:") else None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeApi | None:
        values = os.environ if environ is None else environ
        if values.get(API_URL_ENV) and cpu_rehearsal():
            # The rehearsal's API server (plain http on a private address); never read outside a CPU rehearsal.
            return cls(values[API_URL_ENV], values.get(API_TOKEN_ENV, "rehearsal"))
        host, port = values.get("KUBERNETES_SERVICE_HOST"), values.get("KUBERNETES_SERVICE_PORT", "443")
        token = sa_dir / "token"
        if not host or not token.exists():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token.read_text().strip(), ca_file=str(sa_dir / "ca.crt"))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise KubeError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise KubeError(f"{method} {path}: {exc}") from None
        return json.loads(payload) if payload else None

    def taint_node(self, node: str, value: str, *, attempts: int = 3) -> dict[str, Any]:
        """Adds (or replaces) the gate's taint; every other taint stays as it is. A JSON patch that tests the
        resourceVersion it read, so a concurrent change of the node's taints is retried, never overwritten."""
        taint = {"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT}
        for attempt in range(attempts):
            current = self.request("GET", f"/api/v1/nodes/{node}")
            taints = [t for t in current.get("spec", {}).get("taints") or [] if t.get("key") != TAINT_KEY]
            patch = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/spec/taints", "value": [*taints, taint]},
            ]
            try:
                result: dict[str, Any] = self.request(
                    "PATCH", f"/api/v1/nodes/{node}", patch, content_type="application/json-patch+json"
                )
                return result
            except KubeError as exc:
                if attempt + 1 == attempts or not any(f"HTTP {c}" in str(exc) for c in (409, 422)):
                    raise
        raise AssertionError("unreachable")

    def event(
        self, namespace: str, involved: Mapping[str, str], message: str, *, reason: str = EVENT_REASON
    ) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.fabric-gate-", "namespace": namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": "fabric-gate"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        result: dict[str, Any] = self.request("POST", f"/api/v1/namespaces/{namespace}/events", body)
        return result


def read_workload_uid(
    api: KubeApi | None, workload: str | None, namespace: str, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str | None]:
    """The uid the workload's Event names, and why there is none: a Job's from JOB_UID (its pods' label
    batch.kubernetes.io/controller-uid, k8s/job_parts.py), a RayJob's read from the API (KubeRay v1.7.0 labels the
    pods of a RayJob's cluster with its name, ray.io/originated-from-cr-name, never its uid)."""
    if not workload:
        return None, None
    kind, name = workload.split("/")
    if kind == "Job":
        uid = (os.environ if environ is None else environ).get("JOB_UID")
        return (uid, None) if uid else (None, "JOB_UID is not set")
    if kind == "RayJob" and api is not None:
        try:
            found = api.request("GET", f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}")
        except KubeError as exc:
            return None, str(exc)
        return str(found["metadata"]["uid"]), None
    return None, f"no uid is known for a {kind}"


def taint_value(verdict: GateVerdict) -> str:
    """A label-value-safe word for the taint (the Events carry the words)."""
    return "fallback" if verdict.failing else "below-floor" if verdict.bandwidth_failed else "failed"


def take_out(
    verdict: GateVerdict, api: KubeApi | None, *, namespace: str, workload: str | None, workload_uid: str | None = None
) -> list[str]:
    """Taints the suspects and posts the Events; returns what happened, errors included (never raises).

    Each Event names its object's uid: kubectl (v0.36 pkg/describe/describe.go searchEvents) selects a described
    object's Events by involvedObject.uid, for a node either node.uid or, the kubelet's convention, the node's name;
    an Event without one is listed by `kubectl get events` only."""
    done: list[str] = []
    if api is None:
        return ["no Kubernetes API (no service-account token in the pod): no taint, no Event"]
    message = verdict.summary()
    for node in verdict.suspects:
        uid = node
        try:
            tainted = api.taint_node(node, taint_value(verdict))
            uid = str((tainted.get("metadata") or {}).get("uid") or node)
            done.append(f"tainted {node} {TAINT_KEY}={taint_value(verdict)}:{TAINT_EFFECT}")
        except KubeError as exc:
            done.append(f"could not taint {node}: {exc}")
        try:
            api.event(NODE_EVENT_NAMESPACE, {"kind": "Node", "name": node, "apiVersion": "v1", "uid": uid}, message)
            done.append(f"Event on node {node}")
        except KubeError as exc:
            done.append(f"could not post the Event on node {node}: {exc}")
    if workload:
        kind, name = workload.split("/")
        api_version = "ray.io/v1" if kind.startswith("Ray") else "batch/v1"
        involved = {"kind": kind, "name": name, "namespace": namespace, "apiVersion": api_version}
        found, missing = (workload_uid, None) if workload_uid else read_workload_uid(api, workload, namespace)
        if found:
            involved["uid"] = found
        try:
            api.event(namespace, involved, message)
            done.append(f"Event on {workload}" + (f" (without its uid: {missing})" if missing else ""))
        except KubeError as exc:
            done.append(f"could not post the Event on {workload}: {exc}")
    return done


# --- records, state and outputs ---------------------------------------------------------------


def pod_dir(environ: Mapping[str, str] | None = None) -> Path:
    return Path((os.environ if environ is None else environ).get(POD_DIR_ENV, DEFAULT_POD_DIR))


def write_pod_verdict(verdict: GateVerdict, exit_code: int, directory: Path | None = None) -> Path:
    directory = directory or pod_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "verdict.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**verdict.to_json(), "exit_code": exit_code}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_pod_verdict(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_termination_message(text: str, environ: Mapping[str, str] | None = None) -> bool:
    path = Path((os.environ if environ is None else environ).get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG))
    data = text.encode()[:TERMINATION_LIMIT]
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except OSError:
        return False
    return True


def record_failure(state_dir: Path | None, run_id: str, verdict: GateVerdict) -> int | None:
    """Appends this failure to the run's count on the shared directory; the count so far, None when unwritable."""
    if state_dir is None:
        return None
    path = state_dir / f"failures-{run_id}.jsonl"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"time": time.time(), "suspects": list(verdict.suspects), "summary": verdict.summary()})
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        return sum(1 for row in path.read_text().splitlines() if row.strip())
    except OSError:
        return None


def write_shared_verdict(state_dir: Path | None, run_id: str, verdict: GateVerdict, exit_code: int) -> None:
    """The job's verdict on the shared directory, for a driver that is not one of the ranks (Ray's)."""
    if state_dir is None:
        return
    with contextlib.suppress(OSError):
        write_pod_verdict(verdict, exit_code, state_dir).replace(state_dir / f"verdict-{run_id}.json")


def read_shared_verdict(state_dir: Path | None, run_id: str, *, since: float) -> dict[str, Any] | None:
    """The gate's failed verdict of this run written after `since` (seconds since the epoch), if any."""
    if state_dir is None:
        return None
    path = state_dir / f"verdict-{run_id}.json"
    try:
        if path.stat().st_mtime < since:
            return None
    except OSError:
        return None
    verdict = read_pod_verdict(path)
    if verdict is None or verdict.get("exit_code") not in (EXIT_RETRY, EXIT_FAILED):
        return None
    return verdict


def run_id(config: GateConfig | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Which run gate failures count against: --fabric-gate-run-id, FABRIC_GATE_RUN_ID, the Job's uid (JOB_UID),
    else 'default'."""
    values = os.environ if environ is None else environ
    return (config.run_id if config else None) or values.get(RUN_ID_ENV) or values.get("JOB_UID") or "default"


def exit_code_for(verdict: GateVerdict, failures: int | None, max_failures: int) -> int:
    """RETRY while the run has failures left; FAILED when they are spent, when they cannot be counted (a retry
    would have no bound) or when the verdict is UNKNOWN (no other node makes NCCL print its lines)."""
    if verdict.outcome is Outcome.UNKNOWN or failures is None or failures >= max_failures:
        return EXIT_FAILED
    return EXIT_RETRY


def emf_document(verdict: GateVerdict, *, job_name: str, instance_type: str) -> dict[str, Any]:
    metrics: dict[str, tuple[float, str]] = {
        EMF_FAILED: (0.0 if verdict.outcome is Outcome.PASS else 1.0, "Count"),
        EMF_SECONDS: (verdict.seconds or 0.0, "Seconds"),
    }
    if verdict.bandwidth is not None:
        metrics[EMF_BUSBW] = (verdict.bandwidth.busbw_gbps, "Gigabytes/Second")
    return emf.document(
        metrics,
        {emf.JOB_NAME: job_name, emf.INSTANCE_TYPE: instance_type or "unknown"},
        EMF_DIMENSIONS,
        properties={"Outcome": verdict.outcome.value, "Suspects": list(verdict.suspects), "Nodes": len(verdict.nodes)},
    )


# --- in the job -------------------------------------------------------------------------------


class GateFailedError(RuntimeError):
    """Raised in Ray Train workers (the driver maps it to the exit code from the shared verdict)."""

    def __init__(self, verdict: GateVerdict, exit_code: int) -> None:
        super().__init__(verdict.summary())
        self.verdict = verdict
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type[GateFailedError], tuple[GateVerdict, int]]:
        # Ray Train pickles a worker's exception to its controller; the default rebuilds from args (the summary).
        return (GateFailedError, (self.verdict, self.exit_code))


def nccl_log_path(environ: Mapping[str, str] | None = None, pid: int | None = None) -> Path:
    """NCCL_DEBUG_FILE with NCCL's %h (hostname) and %p (pid) expanded, as NCCL expands them."""
    values = os.environ if environ is None else environ
    template = values.get(NCCL_DEBUG_FILE_ENV, DEFAULT_NCCL_LOG)
    return Path(template.replace("%h", socket.gethostname()).replace("%p", str(os.getpid() if pid is None else pid)))


def own_transport(rank: int, node: str, log: Path) -> RankTransport:
    """This rank's verdict from the NCCL log its own process wrote."""
    if not log.exists():
        return RankTransport(rank, socket.gethostname(), node, Verdict.UNKNOWN.value, f"no NCCL log at {log}")
    report: FabricReport = analyze_paths([str(log)])
    if not report.ranks:
        return RankTransport(rank, socket.gethostname(), node, Verdict.UNKNOWN.value, f"no NCCL lines in {log}")
    verdict = report.ranks[0]
    return RankTransport(rank, verdict.host, node, report.verdict.value, verdict.reason)


def run_gate(config: GateConfig, *, backend: str, stdout: TextIO | None = None) -> GateVerdict:
    """The gate in a job whose default process group is up. Returns PASS or NOT RUN; on FAIL or UNKNOWN it has taken
    the node out and raises GateFailedError(verdict, exit code) on every rank."""
    import torch.distributed as dist

    out = stdout or sys.stderr
    started = time.perf_counter()
    inject = injection()
    if backend != "nccl" and inject is None:
        why = "CPU rehearsal (PLATFORM_REHEARSAL=cpu): no NCCL, no EFA" if cpu_rehearsal() else f"backend {backend}"
        verdict = GateVerdict(Outcome.NOT_RUN, (f"{why}: nothing to measure",))
        if dist.get_rank() == 0:
            print(verdict.summary(), file=out, flush=True)
        return verdict
    earlier = read_pod_verdict(pod_dir() / "verdict.json")
    if earlier is not None and earlier.get("outcome") == Outcome.PASS.value:
        # A restart inside the same pods (ft_launcher, NVRx in-process): the fabric was proven on these nodes.
        return GateVerdict(Outcome.PASS, ("proven earlier in this pod",))
    from training import fabric_gate_run

    return fabric_gate_run.run(config, backend=backend, inject=inject, started=started, out=out)


# --- supervisor: the pod's exit code ----------------------------------------------------------


def supervise(argv: Sequence[str], verdict_file: Path, *, poll_s: float = 0.5, grace_s: float = 30.0) -> int:
    """Runs `argv` (ft_launcher, which turns any worker failure into its own exit 1) and exits with the gate's code
    when a gate verdict appears in the pod, stopping the launcher at once instead of letting it restart workers into
    the same verdict; otherwise with the launcher's own status. SIGTERM/SIGINT are passed on."""
    with contextlib.suppress(FileNotFoundError):
        verdict_file.unlink()
    child = subprocess.Popen(list(argv))

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        try:
            code = child.wait(timeout=poll_s)
            break
        except subprocess.TimeoutExpired:
            pass
        verdict = read_pod_verdict(verdict_file)
        if verdict is not None and verdict.get("exit_code") in (EXIT_RETRY, EXIT_FAILED):
            child.terminate()
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            break
    verdict = read_pod_verdict(verdict_file)
    if verdict is not None and verdict.get("exit_code") in (EXIT_RETRY, EXIT_FAILED):
        print(verdict.get("summary", "FABRIC GATE FAIL"), file=sys.stderr, flush=True)
        return int(verdict["exit_code"])
    return code


# --- judge mode -------------------------------------------------------------------------------


def judge_logs(
    paths: Sequence[str], *, nodes: int, floor: Floor | None, bandwidth: Bandwidth | None
) -> tuple[GateVerdict, FabricReport]:
    """The in-job decision over recorded logs: each rank of the logs is one transport; hosts stand for nodes."""
    report = analyze_paths(paths)
    transports = [RankTransport(r.rank, r.host, r.host, r.verdict.value, r.reason) for r in report.ranks]
    expected = report.world_size if report.world_size else None
    return decide(transports, expected_ranks=expected, expected_nodes=nodes, bandwidth=bandwidth, floor=floor), report


def _judge_main(args: argparse.Namespace) -> int:
    from infra.spec.errors import ConfigError
    from infra.spec.fabric_floors import fabric_floor

    try:
        spec = fabric_floor(args.instance_type)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return JUDGE_BAD_INPUT
    floor = Floor(spec.busbw_gbps, spec.min_message_bytes, spec.instance_type)
    bandwidth = None
    if args.busbw is not None:
        bandwidth = Bandwidth(args.message_bytes if args.message_bytes is not None else floor.message_bytes, args.busbw)
    elif args.message_bytes is not None:
        print("error: --message-bytes needs --busbw", file=sys.stderr)
        return JUDGE_BAD_INPUT
    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        print(f"error: cannot read {', '.join(missing)}", file=sys.stderr)
        return JUDGE_BAD_INPUT
    verdict, report = judge_logs(args.logs, nodes=args.nodes, floor=floor, bandwidth=bandwidth)
    if args.json:
        print(json.dumps({**verdict.to_json(), "analyzer": report.to_json()}, indent=2))
    else:
        print(report.render()[0], end="")
        print(verdict.summary())
    return JUDGE_EXIT.get(verdict.outcome, JUDGE_UNKNOWN)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.fabric_gate", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    judge = commands.add_parser(
        "judge",
        help="the gate's decision on recorded NCCL logs (exit 0 PASS, 1 FAIL, 3 UNKNOWN, 2 bad input)",
    )
    judge.add_argument("--instance-type", required=True, help="whose floor applies (infra/spec/fabric_floors.py)")
    judge.add_argument("--nodes", type=_positive_int, required=True, help="nodes the job ran on")
    judge.add_argument("--busbw", type=_positive_float, default=None, help="measured all-reduce bus bandwidth, GB/s")
    judge.add_argument("--message-bytes", type=_positive_int, default=None, help="the size --busbw was measured at")
    judge.add_argument("--json", action="store_true", help="the verdict as JSON")
    judge.add_argument("logs", nargs="+", metavar="LOG", help="NCCL_DEBUG=INFO logs of the job's ranks")
    sup = commands.add_parser("supervise", help="run a launcher; exit with the gate's code when it failed in the pod")
    sup.add_argument("--verdict-file", type=Path, default=None, help=f"default: ${POD_DIR_ENV}/verdict.json")
    sup.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "judge":
        return _judge_main(args)
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("error: supervise needs a command after --", file=sys.stderr)
        return JUDGE_BAD_INPUT
    return supervise(command, args.verdict_file or pod_dir() / "verdict.json")


if __name__ == "__main__":
    raise SystemExit(main())

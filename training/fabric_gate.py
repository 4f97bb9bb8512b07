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
4. the pod of each suspect node posts a verdict Event on itself (training/fabric_verdict.py; the pods' token may
   create and list Events in their own namespace and nothing else) and waits for the remediation controller's
   answer (fabric_controller/: it checks the claim, taints the node `platform/fabric-gate` NoSchedule, lowers the
   group's Kueue quota); rank 0 emits an EMF line (training/emf.py) and every pod writes the verdict to its
   termination message; then every rank exits with EXIT_RETRY when a node was taken out (the Job's podFailurePolicy
   ignores it: the pods are recreated away from the tainted node) or EXIT_FAILED (FailJob) when none was, after
   `max_failures` gate failures of the same run, or on an UNKNOWN verdict, which no other node can fix.

On a CPU rehearsal (training/rehearsal.py) there is no NCCL and the gate reports NOT RUN with that reason. There
only, FABRIC_GATE_INJECT=fallback:NODE or slow:NODE fakes the verdict of one node (a socket transport, or pairs
with that node under the floor) over gloo, so the taint-and-requeue path can be rehearsed without GPUs, and
FABRIC_GATE_API_URL (+ FABRIC_GATE_API_TOKEN) names the rehearsal's API server (training/kube_api.py).

Standard library and torch only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from training import emf
from training.deadline import EXIT_CODES as DEADLINE_EXIT_CODES
from training.fabric_analyzer import FabricReport, Verdict, analyze_paths
from training.fabric_gate_config import Floor as Floor  # re-exported: the gate's callers name it here
from training.fabric_gate_config import GateConfig as GateConfig
from training.fabric_gate_config import human_bytes
from training.fabric_verdict import TAINT_EFFECT as TAINT_EFFECT
from training.fabric_verdict import TAINT_KEY as TAINT_KEY
from training.fabric_verdict import Answer, ReportedVerdict, read_answer
from training.kube_api import API_TOKEN_ENV as API_TOKEN_ENV
from training.kube_api import API_URL_ENV as API_URL_ENV
from training.kube_api import KubeApi as KubeApi
from training.kube_api import KubeError
from training.rehearsal import cpu_rehearsal

# Pod exit codes (k8s/charts/nvrx_job.py's podFailurePolicy names both). Not 1 (ft_launcher's own failure), not 2
# (bad arguments, FailJob), not 3/4/6/10 (the fabric probe and check), not 128+N (signals).
EXIT_RETRY = 75
"""The gate failed and the suspect node is tainted: recreate the pods elsewhere (podFailurePolicy Ignore)."""
EXIT_FAILED = 76
"""The gate failed `max_failures` times for this run, or cannot decide: fail the job with the verdict (FailJob)."""

# Judge mode exit codes.
JUDGE_PASS, JUDGE_FAIL, JUDGE_BAD_INPUT, JUDGE_UNKNOWN = 0, 1, 2, 3

SERVICE_ACCOUNT = "fabric-gate"
# A cluster-scoped object's core/v1 Events (no eventTime) must be in namespace "default" (or ""): the API server
# refuses any other (pkg/apis/core/validation/events.go legacyValidateEvent, Kubernetes 1.36), and client-go's
# recorder puts a Node's Events there too.
NODE_EVENT_NAMESPACE = "default"
# How long the pods of the suspect nodes wait for the remediation controller's answer to their verdict Events
# (fabric_controller/: it polls every 2 s and checks a few objects); no answer means nothing was taken out.
ANSWER_WAIT_S = 60.0

# Set on gated pods by the charts (k8s/charts/fabric_gate.py gate_env); the defaults keep local runs working.
NODE_NAME_ENV = "NODE_NAME"
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
POD_UID_ENV = "POD_UID"
POD_DIR_ENV = "FABRIC_GATE_POD_DIR"
TERMINATION_LOG_ENV = "FABRIC_GATE_TERMINATION_LOG"
RUN_ID_ENV = "FABRIC_GATE_RUN_ID"
INJECT_ENV = "FABRIC_GATE_INJECT"
NCCL_DEBUG_FILE_ENV = "NCCL_DEBUG_FILE"
DEFAULT_POD_DIR = "/tmp/fabric-gate"
DEFAULT_NCCL_LOG = f"{DEFAULT_POD_DIR}/nccl.%h.%p.log"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4096
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


# --- the verdict to the remediation controller (training/fabric_verdict.py) ---------------------


def taint_value(verdict: GateVerdict) -> str:
    """A label-value-safe word for the taint (the Events carry the words)."""
    return "fallback" if verdict.failing else "below-floor" if verdict.bandwidth_failed else "failed"


@dataclass(frozen=True)
class NodeOutcome:
    """What became of one suspect node's verdict Event: gathered from every pod to pick the exit code."""

    node: str
    taken: bool
    text: str
    workload_uid: str = ""


def report_own_node(
    verdict: GateVerdict,
    api: KubeApi | None,
    *,
    workload: str | None,
    environ: Mapping[str, str] | None = None,
    wait_s: float = ANSWER_WAIT_S,
    poll_s: float = 1.0,
) -> NodeOutcome:
    """Posts this pod's verdict Event (its own node failed) and waits for the controller's answer."""
    values = os.environ if environ is None else environ
    node = values.get(NODE_NAME_ENV) or socket.gethostname()
    pod, uid = values.get(POD_NAME_ENV), values.get(POD_UID_ENV)
    namespace = values.get(POD_NAMESPACE_ENV, "default")
    if api is None:
        return NodeOutcome(node, False, "no Kubernetes API (no service-account token in the pod): no verdict Event")
    if not pod or not uid:
        return NodeOutcome(node, False, f"{POD_NAME_ENV} and {POD_UID_ENV} are not set: no verdict Event")
    claim = ReportedVerdict("", namespace, pod, uid, node, taint_value(verdict), workload or "", verdict.summary())
    try:
        created = api.create_event(claim.to_event())
    except KubeError as exc:
        return NodeOutcome(node, False, f"could not post the verdict Event: {exc}")
    event = str(created["metadata"]["name"])
    answer = wait_for_answer(api, namespace, uid, event, wait_s=wait_s, poll_s=poll_s)
    if answer is None:
        return NodeOutcome(node, False, f"no answer from the remediation controller to Event {event} in {wait_s:g} s")
    return NodeOutcome(node, answer.taken, answer.message, answer.workload_uid)


def wait_for_answer(
    api: KubeApi, namespace: str, pod_uid: str, event: str, *, wait_s: float, poll_s: float
) -> Answer | None:
    """The controller's answer Event on this pod to verdict Event `event` (core/v1 Events select on
    involvedObject.uid: Kubernetes 1.36 pkg/registry/core/event/strategy.go ToSelectableFields)."""
    deadline = time.monotonic() + wait_s
    path, selector = f"/api/v1/namespaces/{namespace}/events", f"involvedObject.uid={pod_uid}"
    while True:
        try:
            events = api.list_items(path, field_selector=selector)
        except KubeError:
            events = []
        for item in events:
            answer = read_answer(item)
            if answer is not None and answer.verdict_event == event:
                return answer
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


# --- records, state and outputs ---------------------------------------------------------------


def pod_dir(environ: Mapping[str, str] | None = None) -> Path:
    return Path((os.environ if environ is None else environ).get(POD_DIR_ENV, DEFAULT_POD_DIR))


def write_pod_verdict(verdict: GateVerdict, exit_code: int, directory: Path | None = None) -> Path:
    """The pod's verdict; a failing one, once written, stays. ft_launcher can restart the workers before `supervise`
    has stopped it, and their gate's later verdict (the run's failures spent) must not replace the one it acts on."""
    directory = directory or pod_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "verdict.json"
    if not stops_the_pod(read_pod_verdict(path)):
        _write_verdict(path, verdict, exit_code)
    return path


def write_stop_verdict(exit_code: int, summary: str, directory: Path | None = None) -> Path:
    """A Capacity Block deadline's verdict (training/deadline.py: stopped or refused) for the supervisor; a stopping
    verdict already there (another rank's, or the gate's) stays."""
    directory = directory or pod_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "verdict.json"
    if not stops_the_pod(read_pod_verdict(path)):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"outcome": "CAPACITY_DEADLINE", "summary": summary, "exit_code": exit_code}) + "\n")
        os.replace(tmp, path)
    return path


def _write_verdict(path: Path, verdict: GateVerdict, exit_code: int) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # each rank writes its own, then one rename wins
    tmp.write_text(json.dumps({**verdict.to_json(), "exit_code": exit_code}, indent=2) + "\n")
    os.replace(tmp, path)


def stops_the_pod(verdict: Mapping[str, Any] | None) -> bool:
    """A recorded verdict that stops the pod: the gate's RETRY or FAILED code, or a Capacity Block's deadline
    (training/deadline.py: checkpointed and stopped, or refused to start)."""
    return verdict is not None and verdict.get("exit_code") in (EXIT_RETRY, EXIT_FAILED, *DEADLINE_EXIT_CODES)


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
        state_dir.mkdir(parents=True, exist_ok=True)
        _write_verdict(state_dir / f"verdict-{run_id}.json", verdict, exit_code)


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
    return verdict if stops_the_pod(verdict) else None


def run_id(config: GateConfig | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Which run gate failures count against: --fabric-gate-run-id, FABRIC_GATE_RUN_ID, the Job's uid (JOB_UID),
    else 'default'."""
    values = os.environ if environ is None else environ
    return (config.run_id if config else None) or values.get(RUN_ID_ENV) or values.get("JOB_UID") or "default"


def exit_code_for(verdict: GateVerdict, failures: int | None, max_failures: int, *, taken: bool) -> int:
    """RETRY only when the controller took a suspect node out (the pods come back elsewhere) and the run has failures
    left; FAILED when nothing was taken out (the pods would come back on the same nodes), when the failures are spent
    or cannot be counted (a retry would have no bound), or when the verdict is UNKNOWN."""
    if verdict.outcome is Outcome.UNKNOWN or not taken or failures is None or failures >= max_failures:
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
    if _proven_in_every_pod(backend):
        # A restart inside the same pods (ft_launcher, NVRx in-process): the fabric was proven on these nodes.
        return GateVerdict(Outcome.PASS, ("proven earlier in every pod",))
    from training import fabric_gate_run

    return fabric_gate_run.run(config, backend=backend, inject=inject, started=started, out=out)


def _proven_in_every_pod(backend: str) -> bool:
    """Whether every rank's pod has passed the gate earlier in its life, decided on a value every rank holds (a MIN
    all-reduce): the gate is a collective, so a pod new to the gang - a hot spare taking a lost node's ranks, a lost
    pod's replacement - makes every rank run it, and its node is proven before its first step."""
    import torch
    import torch.distributed as dist

    from training.fabric_gate_run import collective_device

    earlier = read_pod_verdict(pod_dir() / "verdict.json")
    passed = int(earlier is not None and earlier.get("outcome") == Outcome.PASS.value)
    proven = torch.tensor([passed], device=collective_device(backend))
    dist.all_reduce(proven, op=dist.ReduceOp.MIN)
    return bool(proven.item())


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
        if stops_the_pod(verdict):
            child.terminate()
            try:
                child.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            break
    verdict = read_pod_verdict(verdict_file)
    if verdict is not None and stops_the_pod(verdict):
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

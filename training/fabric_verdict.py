"""The fabric gate's verdict as a job publishes it and the remediation controller answers it: core/v1 Events.

The job holds no node permission (k8s/charts/fabric_gate.py). On a FAIL the pod of each suspect node posts one Event
on itself (involvedObject: its own Pod with the uid the downward API gives it) saying "my node failed the gate". The
remediation controller (fabric_controller/) checks the claim against what the API server knows (the pod runs on that
node, is a member of an admitted gang, the node is a GPU worker of a gated group, the rate bound holds), acts, and
answers with an Event on the same Pod: FabricGateNodeTaken or FabricGateVerdictRefused. The gate waits for the
answers before it picks its exit code: a retry only when a node was taken out.

Why Events: a Ray worker's container never ends on a verdict (the raylet is its main process, and KubeRay deletes the
cluster on a retry), so a termination message would never be written for the RayJob; a pod status field would need
`patch pods/status`, which reaches every pod of the namespace. An Event needs `create events` in the pod's own
namespace only, is written at once (the pods are still running while the controller checks them), and is what
`kubectl describe pod` shows. Events are not authenticated: anyone who may create Events in a gated namespace can
claim a verdict, which is why the controller believes only what it can check (the pod and node exist as claimed) and
bounds what it does (a rate per group, never the last node of a group).

Standard library only: this module ships with the training code and with the controller's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TAINT_KEY = "platform/fabric-gate"
TAINT_EFFECT = "NoSchedule"
TAINT_VALUES = ("fallback", "below-floor", "failed")

VERDICT_REASON = "FabricGateFailed"
TAKEN_REASON = "FabricGateNodeTaken"
REFUSED_REASON = "FabricGateVerdictRefused"
RELEASED_REASON = "FabricGateNodeReleased"
GATE_COMPONENT = "fabric-gate"
CONTROLLER_COMPONENT = "fabric-gate-controller"

_PREFIX = "fabric-gate.platform/"
NODE_ANNOTATION = _PREFIX + "node"
TAINT_ANNOTATION = _PREFIX + "taint"
WORKLOAD_ANNOTATION = _PREFIX + "workload"
VERDICT_ANNOTATION = _PREFIX + "verdict-event"
WORKLOAD_UID_ANNOTATION = _PREFIX + "workload-uid"
# On a ClusterQueue: the nodes the controller took out of it and the quota each took (JSON), the one record the
# controller restores from when an operator releases a node.
TAKEN_ANNOTATION = _PREFIX + "taken"

MESSAGE_LIMIT = 1024


def release_command(node: str) -> str:
    """What an operator runs once a node is repaired; the controller then gives its quota back."""
    return f"kubectl taint node {node} {TAINT_KEY}:{TAINT_EFFECT}-"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def event_object(
    namespace: str,
    involved: Mapping[str, str],
    *,
    reason: str,
    message: str,
    component: str,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A core/v1 Warning Event (no eventTime: the legacy fields kubectl describe reads), named after its object."""
    now = _now()
    metadata: dict[str, Any] = {"generateName": f"{involved['name']}.{component}-", "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": "Warning",
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


@dataclass(frozen=True)
class ReportedVerdict:
    """What a pod claims: its node failed the gate. Nothing in it is checked yet."""

    event: str
    namespace: str
    pod: str
    pod_uid: str
    node: str
    taint: str
    workload: str
    message: str

    def to_event(self) -> dict[str, Any]:
        involved = {"kind": "Pod", "apiVersion": "v1", "namespace": self.namespace, "name": self.pod}
        involved["uid"] = self.pod_uid
        annotations = {NODE_ANNOTATION: self.node, TAINT_ANNOTATION: self.taint, WORKLOAD_ANNOTATION: self.workload}
        return event_object(
            self.namespace,
            involved,
            reason=VERDICT_REASON,
            message=self.message,
            component=GATE_COMPONENT,
            annotations=annotations,
        )


def read_verdict(event: Mapping[str, Any]) -> ReportedVerdict | None:
    """The claim of a verdict Event (None for any other Event, or one missing a field)."""
    meta = event.get("metadata") or {}
    involved = event.get("involvedObject") or {}
    notes = meta.get("annotations") or {}
    if event.get("reason") != VERDICT_REASON or involved.get("kind") != "Pod":
        return None
    fields = (meta.get("name"), involved.get("namespace"), involved.get("name"), involved.get("uid"))
    node, taint = notes.get(NODE_ANNOTATION), notes.get(TAINT_ANNOTATION)
    if not all(fields) or not node or taint not in TAINT_VALUES:
        return None
    name, namespace, pod, uid = (str(f) for f in fields)
    workload = str(notes.get(WORKLOAD_ANNOTATION) or "")
    return ReportedVerdict(name, namespace, pod, uid, str(node), str(taint), workload, str(event.get("message") or ""))


@dataclass(frozen=True)
class Answer:
    """The controller's answer to one verdict Event."""

    verdict_event: str
    taken: bool
    message: str
    workload_uid: str = ""

    def to_event(self, verdict: ReportedVerdict) -> dict[str, Any]:
        involved = {"kind": "Pod", "apiVersion": "v1", "namespace": verdict.namespace, "name": verdict.pod}
        involved["uid"] = verdict.pod_uid
        annotations = {VERDICT_ANNOTATION: self.verdict_event, NODE_ANNOTATION: verdict.node}
        if self.workload_uid:
            annotations[WORKLOAD_UID_ANNOTATION] = self.workload_uid
        return event_object(
            verdict.namespace,
            involved,
            reason=TAKEN_REASON if self.taken else REFUSED_REASON,
            message=self.message,
            component=CONTROLLER_COMPONENT,
            annotations=annotations,
        )


def read_answer(event: Mapping[str, Any]) -> Answer | None:
    meta = event.get("metadata") or {}
    notes = meta.get("annotations") or {}
    reason = event.get("reason")
    if reason not in (TAKEN_REASON, REFUSED_REASON) or not notes.get(VERDICT_ANNOTATION):
        return None
    return Answer(
        str(notes[VERDICT_ANNOTATION]),
        reason == TAKEN_REASON,
        str(event.get("message") or ""),
        str(notes.get(WORKLOAD_UID_ANNOTATION) or ""),
    )

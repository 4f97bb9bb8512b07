"""Whether a verdict takes its node out, and the quota that follows: pure functions over what facts.py read.

A verdict Event is a claim anyone allowed to create Events in a gated namespace could make (training/fabric_verdict.py),
so the controller believes only what it can check, in this order:

1. the pod the Event is about exists with the uid the Event names, is Running, and runs on the node it names
   (a pod speaks only for its own node);
2. the pod is a member of a gang Kueue has admitted (its Job's, or its RayCluster's RayJob's, Workload);
3. the node is a GPU worker of a gated group (labels role=gpu-worker and platform/gpu-group, infra/spec/scheduling.py);
4. the rate bound: at most `max_per_group_per_hour` nodes of a group taken out within an hour;
5. never the last untainted node of a group: a group with no node left runs nothing, and the gate's FabricGateFailed
   alarm (infra/spec/alarms.py) already calls an operator.

A node that already carries the taint is answered "taken" without a second quota change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fabric_controller.config import ControllerConfig, GroupConfig
from training.fabric_verdict import TAINT_KEY, ReportedVerdict

ROLE_LABEL = "role"
GPU_ROLE = "gpu-worker"
GROUP_LABEL = "platform/gpu-group"
HOUR_S = 3600.0


@dataclass(frozen=True)
class Gang:
    """The workload Kueue admits for a pod: a Job, or the RayJob (else RayCluster) owning its RayCluster."""

    namespace: str
    kind: str
    name: str
    uid: str
    api_version: str
    admitted: bool
    why: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass(frozen=True)
class Record:
    """A group's ClusterQueue annotation (training/fabric_verdict.py TAKEN_ANNOTATION): the nodes taken out and the
    quota each took, and when the recent takes were (the rate bound counts them after their node is released)."""

    nodes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    recent: tuple[float, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> Record:
        if not text:
            return cls()
        value = json.loads(text)
        return cls(dict(value.get("nodes") or {}), tuple(float(t) for t in value.get("recent") or ()))

    def dump(self) -> str:
        return json.dumps({"nodes": dict(self.nodes), "recent": list(self.recent)}, sort_keys=True)

    def with_take(self, node: str, entry: Mapping[str, Any], now: float) -> Record:
        recent = (*tuple(t for t in self.recent if now - t < HOUR_S), now)
        return Record({**self.nodes, node: dict(entry)}, recent)

    def without(self, node: str) -> Record:
        return Record({n: e for n, e in self.nodes.items() if n != node}, self.recent)


@dataclass(frozen=True)
class Facts:
    pod: Mapping[str, Any] | None
    node: Mapping[str, Any] | None
    gang: Gang | None
    group_nodes: Sequence[Mapping[str, Any]]
    """Every node labelled with the claimed node's group (the claimed one included)."""
    record: Record
    now: float


@dataclass(frozen=True)
class Take:
    node: str
    group: GroupConfig
    gang: Gang
    already: bool = False


@dataclass(frozen=True)
class Refuse:
    why: str


def has_gate_taint(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])


def decide(claim: ReportedVerdict, facts: Facts, config: ControllerConfig) -> Take | Refuse:
    pod_ref = f"pod {claim.namespace}/{claim.pod}"
    if facts.pod is None:
        return Refuse(f"{pod_ref} does not exist")
    meta, spec = facts.pod.get("metadata") or {}, facts.pod.get("spec") or {}
    if meta.get("uid") != claim.pod_uid:
        return Refuse(f"{pod_ref} has uid {meta.get('uid')}, not {claim.pod_uid}: the Event is about another pod")
    if spec.get("nodeName") != claim.node:
        return Refuse(f"{pod_ref} runs on {spec.get('nodeName')}, not on {claim.node}: a pod speaks for its own node")
    phase = (facts.pod.get("status") or {}).get("phase")
    if phase != "Running":
        return Refuse(f"{pod_ref} is {phase}, not Running")
    if facts.gang is None or not facts.gang.admitted:
        why = facts.gang.why if facts.gang is not None else "no Job or RayCluster owns it"
        return Refuse(f"{pod_ref} is not a member of an admitted gang: {why}")
    if facts.node is None:
        return Refuse(f"node {claim.node} does not exist")
    labels = (facts.node.get("metadata") or {}).get("labels") or {}
    group = config.groups.get(str(labels.get(GROUP_LABEL)))
    if labels.get(ROLE_LABEL) != GPU_ROLE or group is None:
        gated = ", ".join(sorted(config.groups))
        return Refuse(
            f"node {claim.node} is not a GPU worker of a gated group ({ROLE_LABEL}={labels.get(ROLE_LABEL)}, "
            f"{GROUP_LABEL}={labels.get(GROUP_LABEL)}; gated: {gated})"
        )
    if has_gate_taint(facts.node):
        return Take(claim.node, group, facts.gang, already=True)
    recent = [t for t in facts.record.recent if facts.now - t < HOUR_S]
    if len(recent) >= config.max_per_group_per_hour:
        return Refuse(
            f"rate bound: {len(recent)} node(s) of group {group.name} taken out in the last hour (at most "
            f"{config.max_per_group_per_hour}); more failing nodes point at the fabric or the configuration: an "
            "operator decides (trainctl status lists them)"
        )
    others = [n for n in facts.group_nodes if (n.get("metadata") or {}).get("name") != claim.node]
    if not [n for n in others if not has_gate_taint(n)]:
        return Refuse(
            f"node {claim.node} is the last untainted node of group {group.name}: kept in service (the "
            "FabricGateFailed alarm calls an operator); replace it or add a node, then rerun"
        )
    return Take(claim.node, group, facts.gang)


# --- the quota ---------------------------------------------------------------------------------

_QUANTITY = re.compile(r"^(?P<value>[0-9]+)(?P<unit>Ki|Mi|Gi|Ti|)$")


def _quantity(text: str) -> tuple[int, str]:
    """A whole quantity as k8s/queueing.py writes them ("44", "170Gi"); anything else cannot be subtracted safely."""
    found = _QUANTITY.match(str(text))
    if found is None:
        raise ValueError(f"quantity {text!r} is not a whole number with an optional Ki/Mi/Gi/Ti suffix")
    return int(found["value"]), found["unit"]


def _shift(current: str, step: str, sign: int) -> str:
    value, unit = _quantity(current)
    delta, delta_unit = _quantity(step)
    if unit != delta_unit:
        raise ValueError(f"quantity {current!r} and the per-node {step!r} have different units")
    return f"{max(0, value + sign * delta)}{unit}"


def shifted_quota(queue: Mapping[str, Any], group: GroupConfig, sign: int) -> list[dict[str, Any]]:
    """The ClusterQueue's spec.resourceGroups with one node's quota taken from (sign -1) or given back to (+1) the
    group's flavor. ValueError when the flavor is missing or a quantity is not one k8s/queueing.py writes."""
    groups = json.loads(json.dumps((queue.get("spec") or {}).get("resourceGroups") or []))
    for resource_group in groups:
        for flavor in resource_group.get("flavors") or []:
            if flavor.get("name") != group.flavor:
                continue
            for resource in flavor.get("resources") or []:
                step = group.per_node.get(resource.get("name"))
                if step is not None:
                    resource["nominalQuota"] = _shift(str(resource.get("nominalQuota")), step, sign)
            return list(groups)
    raise ValueError(f"ClusterQueue {group.queue} has no flavor {group.flavor}")

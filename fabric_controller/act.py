"""The controller's writes: the node's taint, the group's ClusterQueue quota with its record, and the Events.

Every write is conditional on what was read (a JSON patch `test` of the node's resourceVersion, the ClusterQueue's
resourceVersion in its merge patch), so a concurrent change is re-read, never overwritten."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric_controller.config import GroupConfig
from fabric_controller.decide import Record, Take, shifted_quota
from fabric_controller.facts import KUEUE, cluster_queue, read_record
from training.fabric_verdict import (
    CONTROLLER_COMPONENT,
    TAINT_EFFECT,
    TAINT_KEY,
    TAKEN_ANNOTATION,
    ReportedVerdict,
    event_object,
)
from training.kube_api import MERGE_PATCH, KubeApi, KubeError

# A cluster-scoped object's core/v1 Events must be in namespace "default" (Kubernetes 1.36
# pkg/apis/core/validation/events.go legacyValidateEvent).
NODE_EVENT_NAMESPACE = "default"
ATTEMPTS = 3


def _conflict(exc: KubeError) -> bool:
    return exc.code in (409, 422)


def taint(api: KubeApi, node: str, value: str) -> dict[str, Any]:
    """Adds (or replaces) the gate's taint; every other taint stays as it is."""
    wanted = {"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT}
    for attempt in range(ATTEMPTS):
        current = api.get(f"/api/v1/nodes/{node}")
        taints = [t for t in (current.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": current["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/spec/taints", "value": [*taints, wanted]},
        ]
        try:
            return api.json_patch(f"/api/v1/nodes/{node}", patch)
        except KubeError as exc:
            if attempt + 1 == ATTEMPTS or not _conflict(exc):
                raise
    raise AssertionError("unreachable")


def move_quota(
    api: KubeApi, group: GroupConfig, node: str, *, sign: int, entry: Mapping[str, Any] | None, now: float
) -> Record:
    """Takes one node's quota from the group's ClusterQueue (sign -1, recording the node) or gives it back (+1,
    dropping the node from the record). Returns the record written."""
    for attempt in range(ATTEMPTS):
        queue = cluster_queue(api, group.queue)
        if queue is None:
            raise KubeError(f"ClusterQueue {group.queue} does not exist")
        record = read_record(queue)
        record = record.with_take(node, entry or {}, now) if sign < 0 else record.without(node)
        body = {
            "metadata": {
                "resourceVersion": queue["metadata"]["resourceVersion"],
                "annotations": {TAKEN_ANNOTATION: record.dump()},
            },
            "spec": {"resourceGroups": shifted_quota(queue, group, sign)},
        }
        try:
            api.request("PATCH", f"{KUEUE}/clusterqueues/{group.queue}", body, content_type=MERGE_PATCH)
            return record
        except KubeError as exc:
            if attempt + 1 == ATTEMPTS or not _conflict(exc):
                raise
    raise AssertionError("unreachable")


def event(api: KubeApi, namespace: str, involved: Mapping[str, str], reason: str, message: str) -> None:
    api.create_event(event_object(namespace, involved, reason=reason, message=message, component=CONTROLLER_COMPONENT))


def node_ref(node: Mapping[str, Any] | None, name: str) -> dict[str, str]:
    # kubectl describe node selects a node's Events by involvedObject.uid (kubectl v0.36 describe.go searchEvents).
    uid = str(((node or {}).get("metadata") or {}).get("uid") or name)
    return {"kind": "Node", "apiVersion": "v1", "name": name, "uid": uid}


def taken_entry(claim: ReportedVerdict, take: Take, now: float) -> dict[str, Any]:
    return {"at": now, "taint": claim.taint, "workload": take.gang.ref, "per_node": dict(take.group.per_node)}

"""The hold controller's writes: a ClusterQueue's stopPolicy with its record, conditional on the resourceVersion read
(a merge patch's metadata.resourceVersion: a concurrent change answers 409 and is decided again), and an Event."""

from __future__ import annotations

from typing import Any

from capacity_hold.config import BlockGroup
from capacity_hold.decide import COMPONENT, HOLD_ANNOTATION, HOLD_REASON, RELEASED_REASON, Decision, QueueState
from training.fabric_verdict import event_object
from training.kube_api import MERGE_PATCH, KubeApi

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
# A cluster-scoped object's core/v1 Events must be in namespace "default" (Kubernetes 1.36
# pkg/apis/core/validation/events.go legacyValidateEvent).
EVENT_NAMESPACE = "default"


def queue_path(group: BlockGroup) -> str:
    return f"{KUEUE}/clusterqueues/{group.queue}"


def write(api: KubeApi, group: BlockGroup, state: QueueState, decision: Decision) -> dict[str, Any]:
    """Writes `decision.policy` and its record (or removes the record: a merge patch's null deletes the key)."""
    annotation = decision.record.dump() if decision.record is not None else None
    body = {
        "metadata": {"resourceVersion": state.resource_version, "annotations": {HOLD_ANNOTATION: annotation}},
        "spec": {"stopPolicy": decision.policy},
    }
    patched: dict[str, Any] = api.request("PATCH", queue_path(group), body, content_type=MERGE_PATCH)
    return patched


def event(api: KubeApi, group: BlockGroup, state: QueueState, decision: Decision) -> None:
    involved = {"kind": "ClusterQueue", "apiVersion": "kueue.x-k8s.io/v1beta2", "name": group.queue}
    if state.uid:
        involved["uid"] = state.uid
    reason = HOLD_REASON if decision.record is not None else RELEASED_REASON
    api.create_event(event_object(EVENT_NAMESPACE, involved, reason=reason, message=decision.why, component=COMPONENT))

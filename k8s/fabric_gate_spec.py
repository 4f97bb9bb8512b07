"""What a gated multi-node GPU workload carries (training/fabric_gate.py): the gate's flags from the instance type's
floor, the pod's identity for its verdict Event (the `fabric-gate` ServiceAccount of k8s/charts/fabric_gate.py: Events
in its own namespace only, its token mounted), the downward-API names and uid the verdict speaks with, and where NCCL
writes each rank's log."""

from __future__ import annotations

from typing import Any

from infra.spec import GpuNodeGroupConfig
from infra.spec.fabric_floors import fabric_floor
from training.fabric_gate import (
    DEFAULT_NCCL_LOG,
    DEFAULT_POD_DIR,
    EXIT_FAILED,
    EXIT_RETRY,
    NCCL_DEBUG_FILE_ENV,
    NODE_NAME_ENV,
    POD_DIR_ENV,
    POD_NAME_ENV,
    POD_NAMESPACE_ENV,
    POD_UID_ENV,
    SERVICE_ACCOUNT,
    gate_argv,
)

__all__ = ["EXIT_FAILED", "EXIT_RETRY", "SERVICE_ACCOUNT", "TOKEN_ACK", "gate_env", "gate_flags", "gate_pod"]

# The checkov acknowledgment of the token the gated pods mount (CKV_K8S_38).
TOKEN_ACK = (
    "CKV_K8S_38=the fabric gate posts its verdict as an Event on its own pod and reads the controller's answer; its "
    "ServiceAccount may create and list Events in its own namespace and nothing else (k8s/charts/fabric_gate.py)"
)


def gate_flags(group: GpuNodeGroupConfig, *, state_dir: str, workload: str, run_seconds: int) -> list[str]:
    """The training command line's gate flags: the group's floor (infra/spec/fabric_floors.py) and its EFA devices."""
    floor = fabric_floor(group.instance_type)
    return gate_argv(
        floor_gbps=floor.busbw_gbps,
        message_bytes=floor.min_message_bytes,
        instance_type=group.instance_type,
        state_dir=state_dir,
        workload=workload,
        efa_devices=group.efa_interface_count,
        run_seconds=run_seconds,
    )


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def gate_env() -> list[dict[str, Any]]:
    """The node, pod and namespace the gate names (downward API), NCCL's per-process log file (NCCL expands %h and
    %p) and the pod-local directory of the verdict the supervisor reads."""
    return [
        _field(NODE_NAME_ENV, "spec.nodeName"),
        _field(POD_NAME_ENV, "metadata.name"),
        _field(POD_NAMESPACE_ENV, "metadata.namespace"),
        _field(POD_UID_ENV, "metadata.uid"),
        {"name": NCCL_DEBUG_FILE_ENV, "value": DEFAULT_NCCL_LOG},
        {"name": POD_DIR_ENV, "value": DEFAULT_POD_DIR},
    ]


def gate_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """A hardened pod spec (k8s/ray_spec.py hardened_pod) that runs the gate: its ServiceAccount, token mounted."""
    return {**spec, "serviceAccountName": SERVICE_ACCOUNT, "automountServiceAccountToken": True}

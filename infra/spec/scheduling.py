"""Node labels, the GPU taint and the tolerations/selectors that match them: one place for the
facts both the node groups (CDK) and the pods (Helm values, cdk8s charts) must agree on."""

from __future__ import annotations

from types import MappingProxyType

ROLE_LABEL = "role"
SYSTEM_ROLE = "system"
GPU_ROLE = "gpu-worker"
GPU_GROUP_LABEL = "platform/gpu-group"
INSTANCE_TYPE_LABEL = "platform/instance-type"
# The NVIDIA device plugin's default node affinity requires this label; without it the
# DaemonSet schedules zero pods and reports nothing.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"

GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"

SYSTEM_NODE_SELECTOR: MappingProxyType[str, str] = MappingProxyType({ROLE_LABEL: SYSTEM_ROLE})
GPU_NODE_SELECTOR: MappingProxyType[str, str] = MappingProxyType({GPU_PRESENT_LABEL: "true"})


def gpu_toleration() -> dict[str, str]:
    return {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}


def gpu_group_selector(group: str) -> dict[str, str]:
    """Pods of one GPU node group only."""
    return {ROLE_LABEL: GPU_ROLE, GPU_GROUP_LABEL: group}


def gpu_node_labels(group: str, instance_type: str) -> dict[str, str]:
    return {
        ROLE_LABEL: GPU_ROLE,
        GPU_PRESENT_LABEL: "true",
        INSTANCE_TYPE_LABEL: instance_type,
        GPU_GROUP_LABEL: group,
    }

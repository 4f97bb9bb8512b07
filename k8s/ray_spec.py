"""RayCluster specs built from the environment, the instance facts and the image lock.

Plain dictionaries in the shape of the KubeRay v1 CRDs (k8s/crds/kuberay-v1.7.0/), so the
same spec serves a standalone RayCluster and the cluster a RayJob brings with it; the
gates and tests validate them against the CRD schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig, InstanceType
from infra.spec.namespaces import RAY
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR, gpu_group_selector, gpu_toleration
from infra.spec.versions import RAY_VERSION
from k8s.fabric_env import FabricProfile, fabric_env
from k8s.images import ImageLock

RAY_IMAGE = "ray-train"
CODE_CONFIGMAP = "training-code"
CODE_ROOT = "/opt/ml-platform"
# Ray's ports: GCS, dashboard and job API, client. ClusterIP only: nothing leaves the cluster.
HEAD_PORTS = (("gcs", 6379), ("dashboard", 8265), ("client", 10001))


class WorkloadError(ValueError):
    """A workload that does not fit the environment it is synthesized for."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    cpu: str
    memory: str


def head_resources(instance: InstanceType) -> tuple[Resources, Resources]:
    """(requests, limits) for the head on a system node: half the node requested, three
    quarters at most, the rest for the operator and cluster add-ons (m7i.xlarge: 2/8Gi, 3/12Gi)."""
    return (
        Resources(cpu=str(instance.vcpus // 2), memory=f"{instance.memory_gib // 2}Gi"),
        Resources(cpu=str(instance.vcpus * 3 // 4), memory=f"{instance.memory_gib * 3 // 4}Gi"),
    )


def worker_resources(instance: InstanceType) -> Resources:
    """What a worker pod may use of a GPU node: five sixths of its CPU and memory. The last
    sixth covers kubelet and system reservations and the DaemonSets (CNI, kube-proxy, device
    plugins, node monitoring, FSx node driver). g6.12xlarge: 40 CPU, 160Gi."""
    return Resources(cpu=str(instance.vcpus * 5 // 6), memory=f"{instance.memory_gib * 5 // 6}Gi")


# Restricted-style hardening that Ray needs no exception from: no privilege escalation, no
# Linux capabilities, the runtime's seccomp profile, no Kubernetes API token (autoscaling is
# off, so no Ray pod talks to the API server).
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}


def hardened_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with the pod- and container-level settings above applied; a container that brings
    its own securityContext (built on CONTAINER_SECURITY, e.g. with IPC_LOCK for EFA) keeps it."""
    containers = [
        {**c, "securityContext": c.get("securityContext", dict(CONTAINER_SECURITY))} for c in spec["containers"]
    ]
    return {
        **spec,
        "containers": containers,
        "securityContext": dict(POD_SECURITY),
        "automountServiceAccountToken": False,
    }


def env_list(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def code_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the training-code ConfigMap at CODE_ROOT/training."""
    volume = {"name": "training-code", "configMap": {"name": CODE_CONFIGMAP}}
    mount = {"name": "training-code", "mountPath": f"{CODE_ROOT}/training", "readOnly": True}
    return volume, mount


@dataclass(frozen=True, kw_only=True)
class GpuPodParts:
    """What every whole-node GPU container needs: the node's GPUs and EFA interfaces with CPU and
    memory (requests = limits), the fabric env, /dev/shm and the training code."""

    resources: dict[str, Any]
    env: list[dict[str, str]]
    mounts: list[dict[str, Any]]
    volumes: list[dict[str, Any]]


def gpu_pod_parts(group: GpuNodeGroupConfig, profile: FabricProfile = FabricProfile.EFA) -> GpuPodParts:
    instance = group.instance
    assert instance.gpu is not None  # GPU groups are validated on construction
    size = worker_resources(instance)
    limits = {
        "cpu": size.cpu,
        "memory": size.memory,
        "nvidia.com/gpu": str(instance.gpu.count),
        "vpc.amazonaws.com/efa": str(group.efa_interface_count),
    }
    memory_gib = int(size.memory.removesuffix("Gi"))
    code, code_mount = code_volume()
    return GpuPodParts(
        # Requests equal limits: Guaranteed QoS, so NCCL threads are never throttled.
        resources={"requests": dict(limits), "limits": dict(limits)},
        env=env_list({**fabric_env(instance, profile), "PYTHONPATH": CODE_ROOT}),
        mounts=[{"name": "dshm", "mountPath": "/dev/shm"}, code_mount],
        volumes=[
            # NCCL's intra-node transport and the data loaders use shared memory; the
            # container default (64Mi) makes NCCL fail. A quarter of the pod's memory.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{memory_gib // 4}Gi"}},
            code,
        ],
    )


# Ray folds lines that differ only in words containing digits into "[repeated Nx across cluster]" in the driver log
# (Ray logging docs), which hides all but one rank's NCCL network lines from a fabric verdict: off on every Ray pod.
RAY_LOG_ENV: Mapping[str, str] = MappingProxyType({"RAY_DEDUP_LOGS": "0"})


def head_group(environment: Environment, lock: ImageLock) -> dict[str, Any]:
    instance = environment.system_nodes.instance
    requests, limits = head_resources(instance)
    code, code_mount = code_volume()
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/component": "ray-head"}},
            "spec": hardened_pod(
                {
                    "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                    "containers": [
                        {
                            "name": "ray-head",
                            "image": lock.pinned(RAY_IMAGE),
                            "ports": [{"name": name, "containerPort": port} for name, port in HEAD_PORTS],
                            "env": env_list(
                                {
                                    # The head runs on a GPU-less node; without this the image's
                                    # NVIDIA hooks fail with "failed to initialize NVML".
                                    "NVIDIA_VISIBLE_DEVICES": "void",
                                    "PYTHONPATH": CODE_ROOT,
                                    **RAY_LOG_ENV,
                                }
                            ),
                            "resources": {
                                "requests": {"cpu": requests.cpu, "memory": requests.memory},
                                "limits": {"cpu": limits.cpu, "memory": limits.memory},
                            },
                            "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                            "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}, code_mount],
                        }
                    ],
                    "volumes": [{"name": "ray-logs", "emptyDir": {}}, code],
                }
            ),
        },
    }


def worker_group(group: GpuNodeGroupConfig, lock: ImageLock, profile: FabricProfile) -> dict[str, Any]:
    parts = gpu_pod_parts(group, profile)
    gpus = parts.resources["limits"]["nvidia.com/gpu"]
    return {
        "groupName": group.name,
        "replicas": group.workload_nodes,
        "minReplicas": group.scaling.min_size,
        "maxReplicas": group.scaling.max_size,
        # Must equal the GPU limit, or Ray schedules more (or fewer) GPU tasks than exist.
        "rayStartParams": {"num-gpus": gpus},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/component": "ray-worker", "platform/gpu-group": group.name}},
            "spec": hardened_pod(
                {
                    "nodeSelector": gpu_group_selector(group.name),
                    "tolerations": [gpu_toleration()],
                    "containers": [
                        {
                            "name": "ray-worker",
                            "image": lock.pinned(RAY_IMAGE),
                            "env": [*parts.env, *env_list(RAY_LOG_ENV)],
                            "resources": parts.resources,
                            "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                            "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}, *parts.mounts],
                        }
                    ],
                    "volumes": [{"name": "ray-logs", "emptyDir": {}}, *parts.volumes],
                }
            ),
        },
    }


def gpu_group(environment: Environment, name: str | None) -> GpuNodeGroupConfig:
    groups = {g.name: g for g in environment.gpu_node_groups}
    if not groups:
        raise WorkloadError(f"environment {environment.name!r} has no GPU node group for Ray workers")
    if name is None:
        return environment.gpu_node_groups[0]
    if name not in groups:
        raise WorkloadError(
            f"gpu_group={name!r} is not a GPU node group of environment {environment.name!r}; "
            f"allowed: {', '.join(groups)}"
        )
    return groups[name]


def ray_cluster_spec(
    environment: Environment,
    lock: ImageLock,
    *,
    groups: tuple[GpuNodeGroupConfig, ...] | None = None,
    profile: FabricProfile = FabricProfile.EFA,
) -> dict[str, Any]:
    chosen = environment.gpu_node_groups if groups is None else groups
    return {
        "rayVersion": RAY_VERSION,
        "enableInTreeAutoscaling": False,
        "headGroupSpec": head_group(environment, lock),
        "workerGroupSpecs": [worker_group(g, lock, profile) for g in chosen],
    }


NAMESPACE = RAY.name

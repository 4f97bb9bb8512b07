"""The pods the Ray workloads put on the system nodes, read from the specs the charts emit, for the synth-time check
that they always get a node (infra/spec/system_room.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.spec import Environment
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from infra.spec.system_room import SystemPod, check_system_pods_fit

# KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go BuildAutoscalerContainer: the sidecar's resources when
# autoscalerOptions gives none.
AUTOSCALER_DEFAULT = {"cpu": "500m", "memory": "512Mi"}
_MEMORY_MIB = {
    "Ki": 1 / 1024,
    "Mi": 1,
    "Gi": 1024,
    "Ti": 1024 * 1024,
    "k": 1e3 / 2**20,
    "M": 1e6 / 2**20,
    "G": 1e9 / 2**20,
}


def _millis(value: str) -> int:
    return int(value[:-1]) if value.endswith("m") else round(float(value) * 1000)


def _mib(value: str) -> int:
    for suffix, factor in _MEMORY_MIB.items():
        if value.endswith(suffix):
            return round(float(value[: -len(suffix)]) * factor)
    return round(float(value) / 2**20)


def _requests(container: Mapping[str, Any]) -> tuple[int, int]:
    resources = container.get("resources") or {}
    values = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return _millis(str(values.get("cpu", "0"))), _mib(str(values.get("memory", "0")))


def _pod(name: str, spec: Mapping[str, Any], claim: str | None, extra: Sequence[Mapping[str, Any]]) -> SystemPod:
    cpu = memory = 0
    for container in [*spec.get("containers", []), *extra]:
        c, m = _requests(container)
        cpu, memory = cpu + c, memory + m
    claims = {(v.get("persistentVolumeClaim") or {}).get("claimName") for v in spec.get("volumes", [])}
    return SystemPod(name=name, cpu_millis=cpu, memory_mib=memory, zone_pinned=claim is not None and claim in claims)


def _on_system_nodes(spec: Mapping[str, Any]) -> bool:
    return dict(spec.get("nodeSelector") or {}) == dict(SYSTEM_NODE_SELECTOR)


def ray_system_pods(environment: Environment, kind: str, name: str, spec: Mapping[str, Any]) -> list[SystemPod]:
    """The head of a RayCluster (with the autoscaler sidecar KubeRay adds), or a RayJob's head and submitter."""
    storage = environment.add_ons.checkpoint_storage
    claim = storage.claim_name if storage is not None else None
    cluster = spec["rayClusterSpec"] if kind == "RayJob" else spec
    pods = []
    head = cluster["headGroupSpec"]["template"]["spec"]
    if _on_system_nodes(head):
        sidecar = []
        if cluster.get("enableInTreeAutoscaling"):
            resources = (cluster.get("autoscalerOptions") or {}).get("resources") or {"requests": AUTOSCALER_DEFAULT}
            sidecar = [{"resources": resources}]
        pods.append(_pod(f"{kind} {name} head", head, claim, sidecar))
    submitter = (spec.get("submitterPodTemplate") or {}).get("spec")
    if kind == "RayJob" and submitter is not None and _on_system_nodes(submitter):
        pods.append(_pod(f"{kind} {name} submitter", submitter, claim, []))
    return pods


def check_ray_system_pods(environment: Environment, workloads: Sequence[tuple[str, str, Mapping[str, Any]]]) -> None:
    """Every (kind, name, spec) of the environment's Ray workloads at once: they may all run at the same time."""
    pods = [pod for kind, name, spec in workloads for pod in ray_system_pods(environment, kind, name, spec)]
    check_system_pods_fit(environment, pods)

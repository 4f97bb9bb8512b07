"""Pieces shared by the multi-node Indexed Jobs (fabric checks, the NVRx job): the headless
Service that gives pod 0 a stable DNS name, one pod per node, and the EFA container security."""

from __future__ import annotations

from typing import Any

import cdk8s
from constructs import Construct

from k8s.ray_spec import CONTAINER_SECURITY


def headless_service(scope: Construct, name: str, ports: dict[str, int]) -> None:
    """Pods of Job `name` resolve as `<name>-<index>.<name>`; nothing is exposed."""
    cdk8s.ApiObject(
        scope,
        f"{name}-svc",
        api_version="v1",
        kind="Service",
        metadata=cdk8s.ApiObjectMetadata(name=name),
    ).add_json_patch(
        cdk8s.JsonPatch.add(
            "/spec",
            {
                "clusterIP": "None",
                # Rendezvous starts before any pod is Ready.
                "publishNotReadyAddresses": True,
                "selector": {"job-name": name},
                "ports": [{"name": port_name, "port": port} for port_name, port in ports.items()],
            },
        )
    )


def one_pod_per_node(job_name: str) -> dict[str, Any]:
    """Anti-affinity: the point of these jobs is to cross the network between nodes."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job-name": job_name}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }


def efa_container_security() -> dict[str, Any]:
    """The hardened container context plus IPC_LOCK: libfabric pins (mlocks) the buffers it
    registers with the EFA device, beyond the container's default memlock limit."""
    return {**CONTAINER_SECURITY, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}


def efa_job_metadata(name: str) -> cdk8s.ApiObjectMetadata:
    """Job metadata carrying checkov's per-resource acknowledgment of the one added capability."""
    return cdk8s.ApiObjectMetadata(
        name=name,
        annotations={"checkov.io/skip1": "CKV_K8S_25=IPC_LOCK only: EFA memory registration pins buffers"},
    )

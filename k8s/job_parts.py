"""Pieces shared by the multi-node Indexed Jobs (fabric checks, the NVRx job): the headless
Service that gives pod 0 a stable DNS name, one pod per node, the EFA container security and
the Job's uid for the pods' shared-directory check."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cdk8s
from constructs import Construct

from k8s.ray_spec import CONTAINER_SECURITY

# The uid of the Job, on every pod it creates: the apiserver labels them batch.kubernetes.io/controller-uid
# (Kubernetes >= 1.27; "Jobs" concept page, "Job labels"). Unique per run of a Job of a given name, so the
# shared-directory markers of an earlier run with the same name never count.
JOB_UID_ENV = "JOB_UID"
JOB_UID_FIELD = "metadata.labels['batch.kubernetes.io/controller-uid']"


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


def efa_job_metadata(name: str, *, labels: Mapping[str, str]) -> cdk8s.ApiObjectMetadata:
    """Job metadata: `labels` (the Kueue queue of its GPU group, k8s/queueing.py) and checkov's per-resource
    acknowledgment of the one added capability."""
    return cdk8s.ApiObjectMetadata(
        name=name,
        labels=dict(labels),
        annotations={"checkov.io/skip1": "CKV_K8S_25=IPC_LOCK only: EFA memory registration pins buffers"},
    )


def job_uid_env() -> dict[str, Any]:
    return {"name": JOB_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOB_UID_FIELD}}}


@dataclass(frozen=True, kw_only=True)
class SharedDirCheck:
    """Every pod of an Indexed Job writes a marker into `directory` and waits for all `peers` markers."""

    directory: str
    peers: int
    # How long a pod waits for the others: pods start as far apart as their image pulls finish.
    timeout_s: int
    # The peers' DNS names with {index} (an Indexed Job's `<job>-{index}.<subdomain>`): a peer whose name resolves
    # but whose marker never shows proves the directory unshared (exit 2); one that never resolved is late (exit 3).
    peer_host: str


def precondition_script(argv: list[str], shared: SharedDirCheck | None = None) -> str:
    """The check as one shell line of an Indexed Job's script; with `shared`, the pod's index and the Job's uid."""
    line = shlex.join(argv)
    if shared is not None:
        line += " " + shlex.join(
            [
                *("--shared-dir", shared.directory, "--peers", str(shared.peers)),
                *("--shared-timeout", str(shared.timeout_s), "--peer-host", shared.peer_host),
            ]
        )
        line += f' --index "$JOB_COMPLETION_INDEX" --run-id "${JOB_UID_ENV}"'
    return line

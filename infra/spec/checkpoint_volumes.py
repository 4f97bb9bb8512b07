"""The checkpoint claims: one static PersistentVolume of the FSx for Lustre file system and one claim
binding it in each workload namespace, rendered for the Storage stack (infra/addons/fsx_checkpoints.py
applies them with the file system's id, DNS name and mount name) and read by the cluster rehearsal
(rehearse/cluster), whose scheduler needs each volume's node affinity.

A claim binds exactly one volume and lives in one namespace, so each workload namespace
(CLAIM_NAMESPACES) gets its own volume of the same file system: the NVRx job's checkpoints in
`training`, Ray Train's storage_path in `ray`.
"""

from __future__ import annotations

from typing import Any

from infra.spec import CheckpointStorageConfig, Environment
from infra.spec.namespaces import RAY, TRAINING, NamespaceSpec
from infra.spec.replacement_names import checkpoint_volume_names

STORAGE_CLASS = "fsx-lustre-static"
# Namespaces with a claim on the checkpoint file system; the first keeps the original volume name.
CLAIM_NAMESPACES: tuple[NamespaceSpec, ...] = (TRAINING, RAY)
ZONE_LABEL = "topology.kubernetes.io/zone"


def volume_names(environment: Environment, config: CheckpointStorageConfig) -> dict[str, str]:
    """Namespace -> PersistentVolume name, after the file system's zone (infra/spec/replacement_names.py)."""
    return checkpoint_volume_names(environment, config, tuple(ns.name for ns in CLAIM_NAMESPACES))


def checkpoint_manifests(
    environment: Environment,
    config: CheckpointStorageConfig,
    *,
    availability_zone: str,
    volume_handle: str,
    dns_name: str,
    mount_name: str,
) -> list[dict[str, Any]]:
    """The StorageClass, then a PersistentVolume and its claim per namespace of CLAIM_NAMESPACES."""
    storage_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "fsx.csi.aws.com",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }
    manifests: list[dict[str, Any]] = [storage_class]
    names = volume_names(environment, config)
    capacity = f"{config.storage_capacity_gib}Gi"
    for namespace in CLAIM_NAMESPACES:
        volume_name = names[namespace.name]
        manifests += [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume_name},
                "spec": {
                    "capacity": {"storage": capacity},
                    "volumeMode": "Filesystem",
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "mountOptions": ["flock"],
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        # The same file system behind every volume: the handle names it, the name differs.
                        "volumeHandle": volume_handle,
                        "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
                    },
                    # One file system lives in one AZ; the driver gives the scheduler no
                    # topology of its own, so the volume says where it can be mounted (pods
                    # that mount it, the Ray head on a system node included, land in that zone).
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": ZONE_LABEL, "operator": "In", "values": [availability_zone]}
                                    ]
                                }
                            ]
                        }
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": config.claim_name, "namespace": namespace.name},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": STORAGE_CLASS,
                    "volumeName": volume_name,
                    "resources": {"requests": {"storage": capacity}},
                },
            },
        ]
    return manifests

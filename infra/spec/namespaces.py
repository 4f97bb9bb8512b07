"""Kubernetes namespaces the platform owns, with their Pod Security Standards levels.

Both sides read this: the cdk8s namespace chart emits them, and CDK add-ons and
workload charts refer to them by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.spec.errors import ConfigError
from infra.spec.pod_security import BASELINE_CAPABILITIES, IPC_LOCK
from infra.spec.versions import POD_SECURITY_VERSION

PSS_LEVELS = ("privileged", "baseline", "restricted")
# The label the API server puts on every Namespace, its name (Kubernetes 1.22+, docs reference/labels-annotations-taints
# "kubernetes.io/metadata.name"): what a namespaceSelector names a namespace by.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True, kw_only=True)
class NamespaceSpec:
    name: str
    purpose: str
    # What the API server rejects.
    enforce: str
    # What it reports (kubectl warnings, audit annotations) without rejecting.
    warn: str
    # Capabilities beyond Baseline's list its pods may add. Pod Security Admission has no per-capability exception
    # (and EKS exposes no exemptions), so a namespace that needs one enforces Privileged, and the admission policy
    # emitted with the namespaces (k8s/charts/pod_security.py) holds its pods to Baseline plus these and nothing
    # else. Privileged is enforced only so: with no capabilities here, it is refused.
    capabilities: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field, level in (("enforce", self.enforce), ("warn", self.warn)):
            if level not in PSS_LEVELS:
                raise ConfigError(f"namespaces[{self.name}].{field}", level, PSS_LEVELS)
        if PSS_LEVELS.index(self.warn) < PSS_LEVELS.index(self.enforce):
            raise ConfigError(
                f"namespaces[{self.name}].warn",
                self.warn,
                f"a level at least as strict as enforce ({self.enforce})",
            )
        field = f"namespaces[{self.name}].capabilities"
        if (self.enforce == "privileged") != bool(self.capabilities):
            raise ConfigError(
                field,
                self.capabilities,
                "capabilities exactly when enforce is privileged",
                "enforce baseline (or restricted) when no capability beyond Baseline is needed; enforce privileged "
                "only to add named capabilities, which the admission policy admits on top of Baseline",
            )
        odd = [
            c
            for c in self.capabilities
            if not c.isupper() or c.startswith("CAP_") or c in BASELINE_CAPABILITIES or c == "ALL"
        ]
        if odd:
            raise ConfigError(
                field,
                self.capabilities,
                "Linux capability names as a container's capabilities.add spells them (upper case, no CAP_), "
                f"none of Baseline's own ({', '.join(BASELINE_CAPABILITIES)}) and not ALL",
            )


# Ray GPU workers add IPC_LOCK, as the PyTorch/NVRx jobs and fabric checks do (below).
RAY = NamespaceSpec(
    name="ray",
    purpose="RayCluster and RayJob for the Ray Train fine-tune",
    enforce="privileged",
    warn="baseline",
    capabilities=(IPC_LOCK,),
)

# PyTorch/NVRx jobs and fabric checks add IPC_LOCK (EFA registers pinned memory with the device), which Baseline
# does not allow and Pod Security Admission cannot admit alone: Privileged is enforced here only for that, and the
# admission policy emitted with the namespaces (k8s/charts/pod_security.py) denies every pod that is not Baseline
# plus IPC_LOCK (hostPath, hostNetwork, privileged containers and the rest). What goes beyond Baseline (IPC_LOCK)
# is still reported as a warning and in the audit log.
TRAINING = NamespaceSpec(
    name="training",
    purpose="PyTorch FSDP jobs with NVRx, fabric checks",
    enforce="privileged",
    warn="baseline",
    capabilities=(IPC_LOCK,),
)

# The KubeRay operator's own namespace (created by CDK before its Helm chart).
KUBERAY = NamespaceSpec(
    name="kuberay-system",
    purpose="KubeRay operator",
    enforce="baseline",
    warn="restricted",
)

# The fabric gate's remediation controller (fabric_controller/, k8s/charts/fabric_gate.py): our code alone, nothing
# of a workload, so Restricted holds.
FABRIC_GATE_SYSTEM = NamespaceSpec(
    name="fabric-gate-system",
    purpose="the fabric gate's remediation controller",
    enforce="restricted",
    warn="restricted",
)

# The Capacity Block hold controller (capacity_hold/, k8s/charts/capacity_hold.py), only in an environment with a GPU
# group on a block: our code alone, with a ServiceAccount of its own, so Restricted holds.
CAPACITY_HOLD_SYSTEM = NamespaceSpec(
    name="capacity-hold-system",
    purpose="the Capacity Block hold controller",
    enforce="restricted",
    warn="restricted",
)

# Where workloads run: emitted by the cdk8s chart and applied by CDK (the FSx claim lives here).
TRAINING_NAMESPACES: tuple[NamespaceSpec, ...] = (RAY, TRAINING)

PSS = "pod-security.kubernetes.io"


def pod_security_labels(spec: NamespaceSpec) -> dict[str, str]:
    return {
        f"{PSS}/enforce": spec.enforce,
        f"{PSS}/enforce-version": POD_SECURITY_VERSION,
        f"{PSS}/warn": spec.warn,
        f"{PSS}/warn-version": POD_SECURITY_VERSION,
        f"{PSS}/audit": spec.warn,
        f"{PSS}/audit-version": POD_SECURITY_VERSION,
    }


def namespace_labels(spec: NamespaceSpec, environment: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "ml-platform",
        "platform/environment": environment,
        **pod_security_labels(spec),
    }


def namespace_manifest(spec: NamespaceSpec, environment: str) -> dict[str, Any]:
    """The Namespace object, identical whether CDK applies it or cdk8s emits it."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": spec.name,
            "labels": namespace_labels(spec, environment),
            "annotations": {"platform/purpose": spec.purpose},
        },
    }

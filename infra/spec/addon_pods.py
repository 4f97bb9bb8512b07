"""The pods the platform's add-ons run on its nodes, with the requests kube-scheduler counts for them.

Each record is one pod of a DaemonSet (one per node it selects) or of a Deployment (`replicas` pods on
the nodes it selects), with the pod's effective request (the sum of its containers, or its largest
init container if larger) in millicores and MiB. Values are the ones infra/ passes to the chart or
add-on, else the chart's defaults at the pinned version (infra/spec/versions.py), cited per record.
`where` says which nodes a pod can land on, from its tolerations and selectors:
- ALL: tolerates every taint (or the GPU taint explicitly) and selects every Linux node;
- SYSTEM: does not tolerate the GPU taint, so only the untainted system nodes;
- GPU: selects the GPU nodes (the label every GPU group carries);
- GPU_TYPES: required node affinity on a list of GPU instance types (`instance_types`), GPU taint tolerated.

`enabled_by` names the AddOnsConfig field that installs it; None: always installed (the cluster's
core add-ons, infra/spec/versions.py CORE_ADDONS).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from infra.spec.kueue import KueueProps

if TYPE_CHECKING:
    from infra.spec.environments import AddOnsConfig


class Where(Enum):
    ALL = "all"
    SYSTEM = "system"
    GPU = "gpu"
    GPU_TYPES = "gpu-types"


@dataclass(frozen=True, kw_only=True)
class AddOnPod:
    name: str
    namespace: str
    kind: str  # DaemonSet | Deployment
    cpu_millis: int
    memory_mib: int
    where: Where
    source: str
    replicas: int = 1
    enabled_by: str | None = None
    instance_types: tuple[str, ...] = ()

    def enabled_in(self, add_ons: AddOnsConfig) -> bool:
        """Whether an environment with these add-ons runs this pod."""
        if self.enabled_by is None:
            return True
        value = getattr(add_ons, self.enabled_by)
        return value is not None and value is not False


# KubeRay operator requests: infra/ sets them (infra/addons/kuberay_operator.py reads these); the Kueue
# manager's are KueueProps' (infra/spec/kueue.py).
KUBERAY_OPERATOR_CPU = "100m"
KUBERAY_OPERATOR_MEMORY = "512Mi"
_KUEUE = KueueProps()
# The platform's own controllers (k8s/charts/small_controller.py reads these): the fabric gate's remediation
# controller, and the Capacity Block hold controller, counted whether or not the environment has a block (a pass here
# must be a pass on the cluster).
CONTROLLER_CPU = "50m"
CONTROLLER_MEMORY = "64Mi"


def _millis(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)


def _mib(memory: str) -> int:
    if memory.endswith("Gi"):
        return int(memory[:-2]) * 1024
    if not memory.endswith("Mi"):
        raise ValueError(f"memory {memory!r}: write it in Mi or Gi")
    return int(memory[:-2])


# amazon-cloudwatch-observability v6.2.0 (helm-charts commit ffea3d4 "Release 6.2.0") values.yaml
# dcgmExporter affinity: node.kubernetes.io/instance-type In [...]; the platform's GPU types in it.
DCGM_EXPORTER_INSTANCE_TYPES = ("g6.12xlarge", "p4d.24xlarge", "p5.48xlarge", "p5e.48xlarge")

_D, _S = "DaemonSet", "Deployment"
_KUBE, _CW = "kube-system", "amazon-cloudwatch"

# (name, namespace, kind, replicas, cpu millicores, memory MiB, where, enabled_by, source); dcgm-exporter's
# instance types are added below, the one record with any.
_TABLE: tuple[tuple[str, str, str, int, int, int, Where, str | None, str], ...] = (
    ("aws-node", _KUBE, _D, 1, 25, 0, Where.ALL, None,
     "vpc-cni: aws/amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml at v1.22.4 (resources.requests cpu 25m; init "
     "and nodeAgent resources {}); tolerations operator Exists"),
    ("kube-proxy", _KUBE, _D, 1, 100, 0, Where.ALL, None,
     "kube-proxy EKS add-on: requests cpu 100m, tolerations operator Exists (the add-on's DaemonSet as EKS installs "
     "it; the build's manifest is not published, the value is the long-standing EKS one)"),
    ("eks-pod-identity-agent", _KUBE, _D, 1, 0, 0, Where.ALL, None,
     "aws/eks-pod-identity-agent charts/eks-pod-identity-agent (hack/testdata default template): resources {}, "
     "tolerations operator Exists"),
    ("coredns", _KUBE, _S, 2, 100, 70, Where.SYSTEM, None,
     "CoreDNS EKS add-on: 2 replicas, requests cpu 100m memory 70Mi (kubernetes cluster/addons/dns/coredns manifest "
     "values EKS keeps); tolerates CriticalAddonsOnly only, so not the GPU taint"),
    ("amazon-cloudwatch-observability-controller-manager", _CW, _S, 1, 100, 64, Where.SYSTEM, "observability",
     "amazon-cloudwatch-observability 6.2.0 values.yaml manager.resources.requests 100m/64Mi, manager.tolerations []"),
    ("cloudwatch-agent", _CW, _D, 1, 250, 128, Where.ALL, "observability",
     "amazon-cloudwatch-observability 6.2.0 values.yaml agent.resources.requests 250m/128Mi; tolerations: the GPU "
     "taint's (infra/addons/observability.py)"),
    ("fluent-bit", _CW, _D, 1, 50, 25, Where.ALL, "observability",
     "amazon-cloudwatch-observability 6.2.0 values.yaml containerLogs.fluentBit.resources.requests 50m/25Mi; root "
     "tolerations (the GPU taint's)"),
    ("dcgm-exporter", _CW, _D, 1, 250, 128, Where.GPU_TYPES, "observability",
     "amazon-cloudwatch-observability 6.2.0 values.yaml dcgmExporter.resources.requests 250m/128Mi, node affinity on "
     "GPU instance types"),
    ("nvidia-device-plugin", _KUBE, _D, 1, 0, 0, Where.GPU, "nvidia_device_plugin",
     "NVIDIA/k8s-device-plugin chart 0.20.0 values.yaml resources {}; selector and tolerations from "
     "infra/addons/helm.py on_gpu_nodes"),
    ("aws-efa-k8s-device-plugin", _KUBE, _D, 1, 10, 20, Where.GPU, "efa_device_plugin",
     "aws/eks-charts stable/aws-efa-k8s-device-plugin v0.5.30 values.yaml resources.requests 10m/20Mi; selector and "
     "tolerations from infra/addons/helm.py on_gpu_nodes"),
    ("eks-node-monitoring-agent", _KUBE, _D, 1, 10, 30, Where.ALL, "node_monitoring_agent",
     "aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/values.yaml nodeAgent.resources.requests "
     "10m/30Mi, tolerations operator Exists (its dcgm-server: resources {}, no tolerations)"),
    ("fsx-csi-node", _KUBE, _D, 1, 30, 104, Where.ALL, "checkpoint_storage",
     "kubernetes-sigs/aws-fsx-csi-driver charts/aws-fsx-csi-driver v1.9.0 values.yaml: fsx-plugin 10m/40Mi + "
     "node-driver-registrar 10m/32Mi + liveness-probe 10m/32Mi; node.tolerateAllTaints true"),
    ("fsx-csi-controller", _KUBE, _S, 2, 40, 136, Where.SYSTEM, "checkpoint_storage",
     "aws-fsx-csi-driver v1.9.0 values.yaml: controller.replicaCount 2; fsx-plugin 10m/40Mi + csi-provisioner, "
     "csi-resizer, liveness-probe 10m/32Mi each; tolerations CriticalAddonsOnly, NoExecute"),
    ("kuberay-operator", "kuberay", _S, 1, _millis(KUBERAY_OPERATOR_CPU), _mib(KUBERAY_OPERATOR_MEMORY), Where.SYSTEM,
     "kuberay_operator", "infra/addons/kuberay_operator.py values (resources.requests, nodeSelector role=system)"),
    ("fabric-gate-controller", "fabric-gate-system", _S, 1, _millis(CONTROLLER_CPU), _mib(CONTROLLER_MEMORY),
     Where.SYSTEM, None, "k8s/charts/fabric_gate.py Deployment (k8s/charts/small_controller.py), role=system"),
    ("capacity-hold-controller", "capacity-hold-system", _S, 1, _millis(CONTROLLER_CPU), _mib(CONTROLLER_MEMORY),
     Where.SYSTEM, None, "k8s/charts/capacity_hold.py Deployment (k8s/charts/small_controller.py), role=system"),
    ("kueue-controller-manager", "kueue-system", _S, 1, _millis(_KUEUE.cpu_request), _mib(_KUEUE.memory_request),
     Where.SYSTEM, "kueue",
     "infra/spec/kueue.py KueueProps (controllerManager.manager.resources.requests), nodeSelector role=system"),
)  # fmt: skip
_INSTANCE_TYPES = {"dcgm-exporter": DCGM_EXPORTER_INSTANCE_TYPES}

ADDON_PODS: tuple[AddOnPod, ...] = tuple(
    AddOnPod(
        name=name,
        namespace=namespace,
        kind=kind,
        replicas=replicas,
        cpu_millis=cpu,
        memory_mib=memory,
        where=where,
        enabled_by=enabled_by,
        source=source,
        instance_types=_INSTANCE_TYPES.get(name, ()),
    )
    for name, namespace, kind, replicas, cpu, memory, where, enabled_by, source in _TABLE
)

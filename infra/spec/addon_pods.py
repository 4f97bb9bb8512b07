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

ADDON_PODS: tuple[AddOnPod, ...] = (
    AddOnPod(
        name="aws-node",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=25,
        memory_mib=0,
        where=Where.ALL,
        source="vpc-cni: aws/amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml at v1.22.4 (resources.requests "
        "cpu 25m; init and nodeAgent resources {}); tolerations operator Exists",
    ),
    AddOnPod(
        name="kube-proxy",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=100,
        memory_mib=0,
        where=Where.ALL,
        source="kube-proxy EKS add-on: requests cpu 100m, tolerations operator Exists (the add-on's DaemonSet "
        "as EKS installs it; the build's manifest is not published, the value is the long-standing EKS one)",
    ),
    AddOnPod(
        name="eks-pod-identity-agent",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=0,
        memory_mib=0,
        where=Where.ALL,
        source="aws/eks-pod-identity-agent charts/eks-pod-identity-agent (hack/testdata default template): "
        "resources {}, tolerations operator Exists",
    ),
    AddOnPod(
        name="coredns",
        namespace="kube-system",
        kind="Deployment",
        replicas=2,
        cpu_millis=100,
        memory_mib=70,
        where=Where.SYSTEM,
        source="CoreDNS EKS add-on: 2 replicas, requests cpu 100m memory 70Mi (kubernetes cluster/addons/dns/"
        "coredns manifest values EKS keeps); tolerates CriticalAddonsOnly only, so not the GPU taint",
    ),
    AddOnPod(
        name="amazon-cloudwatch-observability-controller-manager",
        namespace="amazon-cloudwatch",
        kind="Deployment",
        cpu_millis=100,
        memory_mib=64,
        where=Where.SYSTEM,
        enabled_by="observability",
        source="amazon-cloudwatch-observability 6.2.0 values.yaml manager.resources.requests 100m/64Mi, "
        "manager.tolerations []",
    ),
    AddOnPod(
        name="cloudwatch-agent",
        namespace="amazon-cloudwatch",
        kind="DaemonSet",
        cpu_millis=250,
        memory_mib=128,
        where=Where.ALL,
        enabled_by="observability",
        source="amazon-cloudwatch-observability 6.2.0 values.yaml agent.resources.requests 250m/128Mi; "
        "tolerations: the GPU taint's (infra/addons/observability.py)",
    ),
    AddOnPod(
        name="fluent-bit",
        namespace="amazon-cloudwatch",
        kind="DaemonSet",
        cpu_millis=50,
        memory_mib=25,
        where=Where.ALL,
        enabled_by="observability",
        source="amazon-cloudwatch-observability 6.2.0 values.yaml containerLogs.fluentBit.resources.requests "
        "50m/25Mi; root tolerations (the GPU taint's)",
    ),
    AddOnPod(
        name="dcgm-exporter",
        namespace="amazon-cloudwatch",
        kind="DaemonSet",
        cpu_millis=250,
        memory_mib=128,
        where=Where.GPU_TYPES,
        instance_types=DCGM_EXPORTER_INSTANCE_TYPES,
        enabled_by="observability",
        source="amazon-cloudwatch-observability 6.2.0 values.yaml dcgmExporter.resources.requests 250m/128Mi, "
        "node affinity on GPU instance types",
    ),
    AddOnPod(
        name="nvidia-device-plugin",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=0,
        memory_mib=0,
        where=Where.GPU,
        enabled_by="nvidia_device_plugin",
        source="NVIDIA/k8s-device-plugin chart 0.20.0 values.yaml resources {}; selector and tolerations from "
        "infra/addons/helm.py on_gpu_nodes",
    ),
    AddOnPod(
        name="aws-efa-k8s-device-plugin",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=10,
        memory_mib=20,
        where=Where.GPU,
        enabled_by="efa_device_plugin",
        source="aws/eks-charts stable/aws-efa-k8s-device-plugin v0.5.30 values.yaml resources.requests 10m/20Mi; "
        "selector and tolerations from infra/addons/helm.py on_gpu_nodes",
    ),
    AddOnPod(
        name="eks-node-monitoring-agent",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=10,
        memory_mib=30,
        where=Where.ALL,
        enabled_by="node_monitoring_agent",
        source="aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/values.yaml nodeAgent.resources."
        "requests 10m/30Mi, tolerations operator Exists (its dcgm-server: resources {}, no tolerations)",
    ),
    AddOnPod(
        name="fsx-csi-node",
        namespace="kube-system",
        kind="DaemonSet",
        cpu_millis=30,
        memory_mib=104,
        where=Where.ALL,
        enabled_by="checkpoint_storage",
        source="kubernetes-sigs/aws-fsx-csi-driver charts/aws-fsx-csi-driver v1.9.0 values.yaml: fsx-plugin "
        "10m/40Mi + node-driver-registrar 10m/32Mi + liveness-probe 10m/32Mi; node.tolerateAllTaints true",
    ),
    AddOnPod(
        name="fsx-csi-controller",
        namespace="kube-system",
        kind="Deployment",
        replicas=2,
        cpu_millis=40,
        memory_mib=136,
        where=Where.SYSTEM,
        enabled_by="checkpoint_storage",
        source="aws-fsx-csi-driver v1.9.0 values.yaml: controller.replicaCount 2; fsx-plugin 10m/40Mi + "
        "csi-provisioner, csi-resizer, liveness-probe 10m/32Mi each; tolerations CriticalAddonsOnly, NoExecute",
    ),
    AddOnPod(
        name="kuberay-operator",
        namespace="kuberay",
        kind="Deployment",
        cpu_millis=_millis(KUBERAY_OPERATOR_CPU),
        memory_mib=_mib(KUBERAY_OPERATOR_MEMORY),
        where=Where.SYSTEM,
        enabled_by="kuberay_operator",
        source="infra/addons/kuberay_operator.py values (resources.requests, nodeSelector role=system)",
    ),
    AddOnPod(
        name="kueue-controller-manager",
        namespace="kueue-system",
        kind="Deployment",
        cpu_millis=_millis(_KUEUE.cpu_request),
        memory_mib=_mib(_KUEUE.memory_request),
        where=Where.SYSTEM,
        enabled_by="kueue",
        source="infra/spec/kueue.py KueueProps (controllerManager.manager.resources.requests), "
        "nodeSelector role=system",
    ),
)

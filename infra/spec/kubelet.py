"""What the kubelet of an EKS AL2023 node reserves, and so what a node can offer pods (allocatable).

Node allocatable = capacity - kube-reserved - system-reserved - the hard eviction threshold
(Kubernetes docs, "Reserve Compute Resources for System Daemons"). On an AL2023 EKS AMI nodeadm writes
the kubelet configuration (awslabs/amazon-eks-ami, nodeadm/internal/kubelet/config.go, read at main
81fec2e8):

- kube-reserved cpu (getCPUMillicoresToReserve): 6% of the first core, 1% of the second, 0.5% of the
  third and fourth, 0.25% of every core above four, in millicores (integer division per range);
- kube-reserved memory (getMemoryMebibytesToReserve): 11 MiB x maxPods + 255 MiB;
- kube-reserved ephemeral-storage 1Gi; systemReserved is not set (only its cgroup, /system);
- evictionHard memory.available 100Mi (defaultKubeletSubConfig), nodefs 10%, inodes 5%;
- maxPods (CalcMaxPods): ENIs of the default network card x (IPv4 addresses per ENI - 1) + 2, from the
  embedded instance-info.jsonl (`defaultMaxENIs`, `ipv4AddressesPerInterface`). The platform's node
  groups set no maxPods and no maxPodsExpression, and the VPC CNI add-on runs with its defaults
  (ENABLE_PREFIX_DELEGATION "false": aws/amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml at v1.22.4),
  so the formula stands, under the managed node group's cap: EKS writes maxPods into a managed node
  group's user data, at most 110 for instance types with fewer than 30 vCPUs and 250 above (EKS user
  guide, "Choose an optimal Amazon EC2 node instance type", How maxPods is determined).

Published values these reproduce (checked in tests/infra/test_kubelet_reservation.py): nodeadm's e2e
case mime-userdata-merge expects maxPods 58 -> kube-reserved memory 893Mi and cpu 70m on its 2-vCPU
mock instance, kubelet-config-new-instance-type expects maxPods 110 -> 1465Mi.

Capacity is taken as the instance's nominal vCPUs and GiB (infra/spec/instances.py). A real node's
memory capacity is the kernel's MemTotal, a few percent below the nominal size: allocatable here is an
upper bound, so a pod that does not fit here does not fit on the node either.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.spec.instances import InstanceType

# nodeadm config.go getCPUMillicoresToReserve: range bounds (millicores) and basis points per range.
_CPU_RANGES_MILLI = (0, 1000, 2000, 4000)
_CPU_BASIS_POINTS = (600, 100, 50, 25)
KUBE_RESERVED_MEMORY_BASE_MIB = 255
KUBE_RESERVED_MEMORY_PER_POD_MIB = 11
EVICTION_HARD_MEMORY_MIB = 100
KUBE_RESERVED_EPHEMERAL_GIB = 1
# EKS user guide, "How maxPods is determined": the managed node group cap.
MNG_MAX_PODS_SMALL = 110
MNG_MAX_PODS_LARGE = 250
MNG_SMALL_VCPUS = 30


def kube_reserved_cpu_millis(vcpus: int) -> int:
    total = vcpus * 1000
    bounds = (*_CPU_RANGES_MILLI, total)
    reserved = 0
    for i, basis_points in enumerate(_CPU_BASIS_POINTS):
        start, end = bounds[i], bounds[i + 1]
        if total <= start:
            continue
        reserved += (min(total, end) - start) * basis_points // 10000
    return reserved


def kube_reserved_memory_mib(max_pods: int) -> int:
    return KUBE_RESERVED_MEMORY_PER_POD_MIB * max_pods + KUBE_RESERVED_MEMORY_BASE_MIB


def eni_max_pods(spec: InstanceType) -> int:
    """nodeadm CalcMaxPods without an expression: default-card ENIs x (IPs per ENI - 1) + 2."""
    return spec.default_card_interfaces * (spec.ipv4_per_interface - 1) + 2


def managed_node_group_max_pods(spec: InstanceType) -> int:
    cap = MNG_MAX_PODS_SMALL if spec.vcpus < MNG_SMALL_VCPUS else MNG_MAX_PODS_LARGE
    return min(eni_max_pods(spec), cap)


@dataclass(frozen=True, kw_only=True)
class NodeAllocatable:
    """Capacity and allocatable of one node, cpu in millicores and memory in MiB."""

    cpu_capacity_millis: int
    memory_capacity_mib: int
    max_pods: int
    kube_reserved_cpu_millis: int
    kube_reserved_memory_mib: int
    eviction_memory_mib: int

    @property
    def cpu_millis(self) -> int:
        return self.cpu_capacity_millis - self.kube_reserved_cpu_millis

    @property
    def memory_mib(self) -> int:
        return self.memory_capacity_mib - self.kube_reserved_memory_mib - self.eviction_memory_mib


def node_allocatable(spec: InstanceType) -> NodeAllocatable:
    """A managed node group node of this type on the AL2023 EKS AMI."""
    max_pods = managed_node_group_max_pods(spec)
    return NodeAllocatable(
        cpu_capacity_millis=spec.vcpus * 1000,
        memory_capacity_mib=spec.memory_gib * 1024,
        max_pods=max_pods,
        kube_reserved_cpu_millis=kube_reserved_cpu_millis(spec.vcpus),
        kube_reserved_memory_mib=kube_reserved_memory_mib(max_pods),
        eviction_memory_mib=EVICTION_HARD_MEMORY_MIB,
    )

"""The EKS AL2023 kubelet reservation (infra/spec/kubelet.py) against the values nodeadm publishes."""

from __future__ import annotations

import pytest

from infra.spec.instances import INSTANCE_TYPES
from infra.spec.kubelet import (
    eni_max_pods,
    kube_reserved_cpu_millis,
    kube_reserved_memory_mib,
    managed_node_group_max_pods,
    node_allocatable,
)


def test_kube_reserved_matches_nodeadm_e2e_expectations() -> None:
    # awslabs/amazon-eks-ami nodeadm/test/e2e/cases: mime-userdata-merge expects maxPods 58, kubeReserved
    # memory 893Mi and cpu 70m (its mock instance has 2 vCPUs); kubelet-config-new-instance-type: 110 -> 1465Mi.
    assert kube_reserved_memory_mib(58) == 893
    assert kube_reserved_memory_mib(110) == 1465
    assert kube_reserved_cpu_millis(2) == 70


@pytest.mark.parametrize(
    ("vcpus", "millis"),
    # 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% above (nodeadm getCPUMillicoresToReserve).
    [(1, 60), (2, 70), (4, 80), (48, 80 + 44 * 2.5), (192, 80 + 188 * 2.5)],
)
def test_kube_reserved_cpu_by_core_ranges(vcpus: int, millis: float) -> None:
    assert kube_reserved_cpu_millis(vcpus) == int(millis)


def test_max_pods_counts_the_default_network_card_only() -> None:
    # nodeadm instance-info.jsonl: p5.48xlarge defaultMaxENIs 2, ipv4AddressesPerInterface 50.
    assert eni_max_pods(INSTANCE_TYPES["p5.48xlarge"]) == 2 * 49 + 2 == 100
    assert eni_max_pods(INSTANCE_TYPES["g6.12xlarge"]) == 8 * 29 + 2 == 234
    # The managed node group cap (110 below 30 vCPUs, 250 above) does not bind these types.
    assert managed_node_group_max_pods(INSTANCE_TYPES["m7i.xlarge"]) == 58


@pytest.mark.parametrize(
    ("instance", "cpu_millis", "memory_mib", "pods"),
    [
        ("m7i.xlarge", 4000 - 80, 16 * 1024 - (11 * 58 + 255) - 100, 58),
        ("g6.12xlarge", 48000 - 190, 192 * 1024 - (11 * 234 + 255) - 100, 234),
        ("p5.48xlarge", 192000 - 550, 2048 * 1024 - (11 * 100 + 255) - 100, 100),
    ],
)
def test_allocatable_is_capacity_less_kube_reserved_and_eviction(
    instance: str, cpu_millis: int, memory_mib: int, pods: int
) -> None:
    allocatable = node_allocatable(INSTANCE_TYPES[instance])
    assert (allocatable.cpu_millis, allocatable.memory_mib, allocatable.max_pods) == (cpu_millis, memory_mib, pods)

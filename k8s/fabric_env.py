"""NCCL / libfabric environment for GPU containers, derived from the instance facts.

Two profiles: `EFA` (what every workload gets) and `TCP_BASELINE`, which exists only for
A/B benchmarks that measure what EFA buys. Every variable is written out explicitly in
the manifest, so what a job ran with is visible in `kubectl get -o yaml`.

Sources: NCCL environment-variable docs; aws-ofi-nccl `doc/efa-env-var.md`.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType

from infra.spec.instances import InstanceType

# aws-ofi-nccl named its network "AWS Libfabric" up to v1.11.0 and "Libfabric" after; later versions rename
# themselves back when NCCL_NET says "AWS Libfabric" (src/nccl_ofi_interface_nvidia.c nvidia_plugin_name_fixup),
# so the old name is the one value every plugin version matches.
OFI_NETWORK_NAME = "AWS Libfabric"
POD_INTERFACE = "eth0"


class FabricProfile(Enum):
    EFA = "efa"
    TCP_BASELINE = "tcp-baseline"


def fabric_env(instance: InstanceType, profile: FabricProfile = FabricProfile.EFA) -> MappingProxyType[str, str]:
    """The variables for a container on `instance`, in a stable order."""
    if instance.efa is None and profile is FabricProfile.EFA:
        raise ValueError(f"{instance.name} has no EFA; only the {FabricProfile.TCP_BASELINE.value} profile applies")
    env: dict[str, str] = {
        # INFO with the INIT and NET subsystems prints exactly the network-selection lines the
        # fabric analyzer reads ("Using network ...", "Selected provider is ...").
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        # The pod's own interface for NCCL's bootstrap and socket traffic.
        "NCCL_SOCKET_IFNAME": POD_INTERFACE,
    }
    if profile is FabricProfile.TCP_BASELINE:
        env |= {
            # Deliberately sockets: the "before" half of an EFA A/B measurement, never a workload.
            "NCCL_NET": "Socket",
            "NCCL_NET_PLUGIN": "none",
            "FI_PROVIDER": "tcp",
        }
        return MappingProxyType(env)
    assert instance.efa is not None
    env |= {
        # NCCL_NET forces the named network and disables the silent fallback to sockets: if
        # aws-ofi-nccl cannot load or finds no EFA device, NCCL fails instead of crawling.
        "NCCL_NET": OFI_NETWORK_NAME,
        # Loads libnccl-net-ofi.so (picks the plugin file; on its own it does not stop fallback).
        "NCCL_NET_PLUGIN": "ofi",
        # Only read by aws-ofi-nccl <= 1.5, harmless later; keeps libfabric off the tcp provider.
        "FI_PROVIDER": "efa",
    }
    # GPUDirect RDMA (p4d, p5): the NIC reads and writes GPU memory directly; implied by libfabric >= 1.18, needed
    # before. Written out as 0 where the device has no RDMA read (g6): libfabric aborts with "device has no
    # rdma-read capability" when it is 1 there, so an image default must not decide it.
    env["FI_EFA_USE_DEVICE_RDMA"] = "1" if instance.efa.gpudirect_rdma else "0"
    # No hugepages-2Mi request (AWS's EFA pod examples ask 5120Mi): EFA does not need huge pages. libfabric's EFA
    # provider only prefers them for its bounce-buffer pools (prov/efa efa_rdm_ep_create_pke_pool:
    # OFI_BUFPOOL_HUGEPAGES unless FI_EFA_USE_HUGE_PAGE=0) and falls back to ordinary pages when none can be had
    # (src/common/ofi_bufpool.c). A pod that requests none has a hugetlb cgroup limit of 0, so the node's reservation
    # (the EFA installer's efa-config reserves ~110 MB per core at boot) is no help and the fallback would decide; 0
    # says it outright, keeps the pools in the pod's own memory request, and keeps fork() (DataLoader workers) clear
    # of the huge-page pool (awsome-distributed-training 1.architectures/efa-cheatsheet.md: "minor performance hit").
    # docs/fabric-and-alarms.md, "No hugepages".
    env["FI_EFA_USE_HUGE_PAGE"] = "0"
    return MappingProxyType(env)

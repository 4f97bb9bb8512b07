"""Subnet address arithmetic: does each private subnet hold the nodes and pods planned for it?

The VPC CNI (secondary-IP mode, the EKS default with WARM_ENI_TARGET=1) gives every pod a
VPC address and attaches whole ENIs to a node, each ENI taking `ipv4_per_interface`
addresses at once. So a node can hold at most

    ENIs in use = ceil(max_pods / (ipv4_per_interface - 1)) + 1 warm ENI
    addresses   = min(ENIs in use, max_network_interfaces) * ipv4_per_interface

where max_pods is what the kubelet is given (infra/spec/kubelet.py, its one home: nodeadm's
default-card ENIs * (IPs per ENI - 1) + 2 under the managed node group's 110/250 cap).
EFA-only interfaces take no address; a primary `efa` interface is one of the ENIs counted above, and each further `efa`
interface (p4d's cards 1-3) takes one more.

Per environment, the GPU zone carries every GPU node (EFA keeps them in one AZ) plus,
worst case, every system node; each group may surge by one node during a rolling update.
Each subnet also loses 5 addresses to AWS, up to 4 to EKS control-plane ENIs (AWS asks
for at least 16 free), one per interface endpoint, and a few for the kubectl Lambda.

Worked figures (from infra/spec/instances.py):
    m7i.xlarge   max_pods 58   -> 4 ENIs x 15 =  60 addresses per node
    g6.12xlarge  max_pods 234  -> 8 ENIs x 30 = 240 addresses per node
    p5.48xlarge  max_pods 100  -> 4 ENIs x 50 = 200 addresses per node (an upper bound:
                 the VPC CNI attaches ENIs on card 0 only, which holds 2; docs/deploy.md)
    prod GPU AZ: 9 x p5 (1,800) + 5 x g6 (1,200) + 5 x m7i (300) + overhead (34) = 3,334
A /21 (2,048) is too small for prod; the /18 default (16,384) leaves room for 4x growth.
"""

from __future__ import annotations

import ipaddress
import math
from typing import TYPE_CHECKING

from infra.spec import endpoints
from infra.spec.efa import efa_layout
from infra.spec.errors import ConfigError
from infra.spec.instances import InstanceType
from infra.spec.kubelet import managed_node_group_max_pods

if TYPE_CHECKING:
    from infra.spec.environments import Environment, NetworkConfig

AWS_RESERVED_PER_SUBNET = 5
EKS_CONTROL_PLANE_ADDRESSES = 16
INTERFACE_ENDPOINTS = len(endpoints.INTERFACE_ENDPOINTS)
KUBECTL_LAMBDA_ADDRESSES = 8
ROLLING_UPDATE_SURGE = 1


def max_pods(spec: InstanceType) -> int:
    return managed_node_group_max_pods(spec)


def addresses_per_node(spec: InstanceType) -> int:
    enis = math.ceil(max_pods(spec) / (spec.ipv4_per_interface - 1)) + 1
    return min(enis, spec.max_network_interfaces) * spec.ipv4_per_interface


def subnet_overhead() -> int:
    return AWS_RESERVED_PER_SUBNET + EKS_CONTROL_PLANE_ADDRESSES + INTERFACE_ENDPOINTS + KUBECTL_LAMBDA_ADDRESSES


def extra_efa_addresses(spec: InstanceType, efa_interfaces: int) -> int:
    """Addresses taken by `efa` (ENA + EFA) interfaces beyond the primary; efa-only take none."""
    return sum(slot.takes_an_address for slot in efa_layout(spec, efa_interfaces)[1:])


def gpu_zone_demand(env: Environment) -> int:
    """Addresses the GPU zone's private subnet must hold in the worst case."""
    per_node = [
        (
            addresses_per_node(g.instance) + extra_efa_addresses(g.instance, g.efa_interface_count),
            g.scaling.max_size + ROLLING_UPDATE_SURGE,
        )
        for g in env.gpu_node_groups
    ]
    per_node.append(
        (addresses_per_node(env.system_nodes.instance), env.system_nodes.scaling.max_size + ROLLING_UPDATE_SURGE)
    )
    return sum(addresses * count for addresses, count in per_node) + subnet_overhead()


def check_address_budget(env: Environment) -> None:
    capacity = 2 ** (32 - env.network.private_subnet_prefix)
    demand = gpu_zone_demand(env)
    if demand > capacity:
        raise ConfigError(
            "network.private_subnet_prefix",
            env.network.private_subnet_prefix,
            f"a subnet of at least {demand} addresses for environment {env.name!r} "
            f"(its GPU zone's nodes at max size plus surge; /{env.network.private_subnet_prefix} has {capacity})",
            "use a shorter prefix (e.g. /18) or lower the node groups' max_size",
        )


def subnet_plan(network: NetworkConfig) -> dict[str, tuple[str, str]]:
    """AZ -> (public CIDR, private CIDR), as aws-cdk-lib's Vpc allocates them: subnet
    configurations in declared order (public, then private; infra/network.py), each over the AZs
    in order, every block at the next free address aligned to its size (aws-ec2 ip-addresses.ts
    `Cidr.allocateSubnetsCidr`, network-util.ts `NetworkBuilder.addSubnet`). The committed
    template snapshots hold the same CIDRs (tests/test_architecture.py compares them)."""
    vpc = ipaddress.IPv4Network(network.cidr)
    cursor = int(vpc.network_address)
    allocated: list[list[str]] = []
    for prefix in (network.public_subnet_prefix, network.private_subnet_prefix):
        size = 2 ** (32 - prefix)
        blocks = []
        for _ in network.availability_zones:
            cursor = -(-cursor // size) * size
            blocks.append(str(ipaddress.IPv4Network((cursor, prefix))))
            cursor += size
        allocated.append(blocks)
    public, private = allocated
    return {az: (public[i], private[i]) for i, az in enumerate(network.availability_zones)}

"""subnet: if the VPC is deployed, each private subnet has free addresses for its nodes' interfaces and pods
(ec2:DescribeVpcs, DescribeSubnets, DescribeInstances)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from infra.spec import Environment
from infra.spec.addressing import (
    AWS_RESERVED_PER_SUBNET,
    ROLLING_UPDATE_SURGE,
    addresses_per_node,
    gpu_zone_demand,
    subnet_overhead,
)
from trainctl.aws import Aws
from trainctl.preflight.results import (
    ENVIRONMENT_TAG,
    STACK_NAME_TAG,
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
)


def addresses_needed(env: Environment, zone: str) -> int:
    """Free addresses a private subnet needs (infra/spec/addressing.py; AWS's reserved 5 are never free)."""
    if zone == env.gpu_availability_zone:
        return gpu_zone_demand(env) - AWS_RESERVED_PER_SUBNET
    system = env.system_nodes
    nodes = addresses_per_node(system.instance) * (system.scaling.max_size + ROLLING_UPDATE_SURGE)
    return nodes + subnet_overhead() - AWS_RESERVED_PER_SUBNET


def addresses_held(instances: Iterable[Mapping[str, Any]]) -> int:
    """Private addresses on the interfaces of running instances (they count among the needed ones)."""
    return sum(len(eni.get("PrivateIpAddresses", [])) for i in instances for eni in i.get("NetworkInterfaces", []))


def evaluate_subnet(
    zone: str,
    subnet: Mapping[str, Any] | None,
    *,
    needed: int,
    held: int,
    cluster_name: str,
    gpu_zone: bool,
) -> CheckResult:
    if subnet is None:
        return CheckResult(
            Check.SUBNET,
            f"private {zone}",
            Status.WARN,
            f"the deployed VPC has no private subnet in {zone}",
            "compare network.availability_zones in infra/spec/environments.py with the deployed VPC",
        )
    subject = f"private {zone} ({subnet.get('SubnetId')}, {subnet.get('CidrBlock')})"
    available = int(subnet.get("AvailableIpAddressCount", 0))
    what = "GPU and system nodes" if gpu_zone else "system nodes"
    basis = f"{what} at max size plus surge, their interfaces and pods, control plane, endpoints"
    held_text = f" + {held} held by {cluster_name}'s nodes" if held else ""
    if available + held >= needed:
        return CheckResult(
            Check.SUBNET, subject, Status.PASS, f"{available} free{held_text} >= {needed} needed ({basis})"
        )
    return CheckResult(
        Check.SUBNET,
        subject,
        Status.FAIL,
        f"{available} free{held_text} < {needed} needed ({basis})",
        "free addresses in the subnet (unused network interfaces, other workloads), lower max_size of the node "
        "groups, or enlarge network.private_subnet_prefix (a new VPC)",
    )


def subnet_checks(env: Environment, aws: Aws) -> list[CheckResult]:
    vpcs = aws.vpcs_tagged(ENVIRONMENT_TAG, env.name)
    if not vpcs:
        return [
            CheckResult(
                Check.SUBNET,
                "vpc",
                Status.PASS,
                f"no VPC tagged {ENVIRONMENT_TAG}={env.name} in {aws.region}: not deployed yet; the plan's CIDR "
                "arithmetic is checked at synth (infra/spec/addressing.py)",
            )
        ]
    matching = [v for v in vpcs if v.get("CidrBlock") == env.network.cidr]
    if not matching:
        found = ", ".join(f"{v.get('VpcId')} ({v.get('CidrBlock')})" for v in vpcs)
        return [
            CheckResult(
                Check.SUBNET,
                "vpc",
                Status.WARN,
                f"VPC(s) tagged {ENVIRONMENT_TAG}={env.name} have another CIDR than the declared "
                f"{env.network.cidr}: {found}; subnets not checked",
                "find out which stack owns them; a deploy with another CIDR replaces the VPC",
            )
        ]
    stack = f"{env.cluster.name}-platform"
    vpc = next(
        (
            v
            for v in matching
            if any(t.get("Key") == STACK_NAME_TAG and t.get("Value") == stack for t in v.get("Tags", []))
        ),
        matching[0],
    )
    by_zone = {s.get("AvailabilityZone"): s for s in aws.private_subnets(str(vpc["VpcId"]))}
    results = []
    for zone in env.network.availability_zones:
        subnet = by_zone.get(zone)
        needed = addresses_needed(env, zone)
        held = 0
        if subnet is not None and int(subnet.get("AvailableIpAddressCount", 0)) < needed:
            held = addresses_held(aws.cluster_instances(str(subnet["SubnetId"]), env.cluster.name))
        results.append(
            evaluate_subnet(
                zone,
                subnet,
                needed=needed,
                held=held,
                cluster_name=env.cluster.name,
                gpu_zone=zone == env.gpu_availability_zone,
            )
        )
    return results


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    say("private subnets of the deployed VPC")
    return attempt(Check.SUBNET, ["vpc"], aws.region, lambda: subnet_checks(env, aws))

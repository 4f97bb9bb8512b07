"""offering: each GPU instance type is offered in the GPU zone (ec2:DescribeInstanceTypeOfferings)."""

from __future__ import annotations

from collections.abc import Iterable

from infra.spec import Environment, GpuNodeGroupConfig
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    group_subject,
)


def evaluate_offering(group: GpuNodeGroupConfig, zone: str, offered: Iterable[str], region: str) -> CheckResult:
    if group.instance_type in set(offered):
        return CheckResult(Check.OFFERING, group_subject(group), Status.PASS, f"offered in {zone}")
    return CheckResult(
        Check.OFFERING,
        group_subject(group),
        Status.FAIL,
        f"{group.instance_type} is not offered in {zone} (region {region})",
        f"set gpu_availability_zone (infra/spec/environments.py) to a zone of the VPC that offers it: "
        f"aws ec2 describe-instance-type-offerings --location-type availability-zone "
        f"--filters Name=instance-type,Values={group.instance_type} --region {region}; or pick another type",
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    groups = env.gpu_node_groups
    if not groups:
        return []
    zone = env.gpu_availability_zone
    say(f"instance type offerings in {zone}")

    def offering() -> list[CheckResult]:
        offered = aws.offered_instance_types(zone, sorted({g.instance_type for g in groups}))
        return [evaluate_offering(g, zone, offered, aws.region) for g in groups]

    return attempt(Check.OFFERING, [group_subject(g) for g in groups], aws.region, offering)

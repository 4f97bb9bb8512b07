"""quota: the On-Demand vCPU quotas cover the on-demand GPU groups at max size plus a rolling update's
surge node (servicequotas:GetServiceQuota)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.addressing import (
    ROLLING_UPDATE_SURGE,
)
from infra.spec.environments import CapacityKind
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    group_subject,
)


@dataclass(frozen=True)
class VcpuQuota:
    code: str
    name: str
    families: tuple[str, ...]
    """Letters that start the instance family name (p5e -> p)."""


VCPU_QUOTAS = (
    VcpuQuota("L-417A185B", "Running On-Demand P instances", ("p",)),
    VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances", ("g", "vt")),
)


def quota_for(instance_type: str) -> VcpuQuota | None:
    letters = re.match(r"[a-z]+", instance_type)
    prefix = letters.group() if letters else ""
    return next((q for q in VCPU_QUOTAS if prefix in q.families), None)


def vcpus_needed(groups: Sequence[GpuNodeGroupConfig], *, surge: int = 0) -> int:
    return sum((g.scaling.max_size + surge) * g.instance.vcpus for g in groups)


def evaluate_quota(quota: VcpuQuota, groups: Sequence[GpuNodeGroupConfig], value: float, region: str) -> CheckResult:
    subject = f"{quota.code} ({quota.name})"
    need = vcpus_needed(groups)
    with_surge = vcpus_needed(groups, surge=ROLLING_UPDATE_SURGE)
    parts = ", ".join(f"{g.name}: {g.scaling.max_size} x {g.instance.vcpus}" for g in groups)
    surge_parts = ", ".join(
        f"{g.name}: ({g.scaling.max_size}+{ROLLING_UPDATE_SURGE}) x {g.instance.vcpus}" for g in groups
    )
    fix = (
        f"request at least {with_surge} vCPUs: aws service-quotas request-service-quota-increase "
        f"--service-code ec2 --quota-code {quota.code} --desired-value {with_surge} --region {region}"
    )
    if value < need:
        return CheckResult(
            Check.QUOTA, subject, Status.FAIL, f"{value:g} vCPUs < {need} needed at max size ({parts})", fix
        )
    if value < with_surge:
        return CheckResult(
            Check.QUOTA,
            subject,
            Status.WARN,
            f"{value:g} vCPUs cover max size ({need}) but not a rolling update's surge node ({with_surge})",
            fix,
        )
    return CheckResult(
        Check.QUOTA,
        subject,
        Status.PASS,
        f"{value:g} vCPUs >= {with_surge} needed at max size plus a surge node ({surge_parts}); "
        "instances already running in the region count against it too",
    )


def evaluate_unquoted(group: GpuNodeGroupConfig) -> CheckResult:
    """A group the On-Demand quotas do not apply to: on a reservation, or of a family without a known quota."""
    if group.capacity.kind is not CapacityKind.ON_DEMAND:
        return CheckResult(
            Check.QUOTA,
            group_subject(group),
            Status.PASS,
            f"skipped: runs on {group.capacity.kind.value} {group.capacity.reservation_id} (see the capacity row)",
        )
    return CheckResult(
        Check.QUOTA,
        group_subject(group),
        Status.WARN,
        f"no On-Demand vCPU quota known for the family of {group.instance_type}",
        "check its quota in the Service Quotas console (EC2) by hand",
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    groups = env.gpu_node_groups
    on_demand = [g for g in groups if g.capacity.kind is CapacityKind.ON_DEMAND]
    results: list[CheckResult] = []
    for quota in VCPU_QUOTAS:
        members = [g for g in on_demand if quota_for(g.instance_type) is quota]
        if not members:
            continue
        say(f"quota {quota.code} ({quota.name})")

        def quota_check(quota: VcpuQuota = quota, members: list[GpuNodeGroupConfig] = members) -> list[CheckResult]:
            value = float(aws.service_quota(quota.code)["Value"])
            return [evaluate_quota(quota, members, value, aws.region)]

        results += attempt(Check.QUOTA, [f"{quota.code} ({quota.name})"], aws.region, quota_check)
    results.extend(evaluate_unquoted(g) for g in groups if g not in on_demand or quota_for(g.instance_type) is None)
    return results

"""capacity and placement: a configured reservation or Capacity Block exists, is active (or scheduled) and
matches type, zone and count; one made in a cluster placement group is launched into that group
(ec2:DescribeCapacityReservations). One module: both rows of a group come from one lookup, side by side."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.environments import CapacityKind
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    date_text,
    group_subject,
)

READY_STATES = frozenset({"active"})
NOT_YET_STATES = frozenset({"scheduled", "payment-pending", "pending", "assessing", "delayed"})
# Capacity Blocks show zero instances until they start; the size is in this tag.
REQUESTED_QUANTITY_TAG = "aws:ec2capacityreservation:incrementalRequestedQuantity"


def reservation_instance_count(reservation: Mapping[str, Any]) -> int:
    total = int(reservation.get("TotalInstanceCount", 0))
    if total == 0 and reservation.get("State") in NOT_YET_STATES:
        for tag in reservation.get("Tags", []):
            if tag.get("Key") == REQUESTED_QUANTITY_TAG and str(tag.get("Value", "")).isdigit():
                return int(tag["Value"])
    return total


def evaluate_capacity(
    group: GpuNodeGroupConfig,
    reservation: Mapping[str, Any] | None,
    *,
    zone: str,
    nodes_needed: int,
    region: str,
) -> CheckResult:
    """`nodes_needed`: the max size of every group that launches into this reservation, summed."""
    subject = group_subject(group)
    capacity = group.capacity
    if capacity.kind is CapacityKind.ON_DEMAND or capacity.reservation_id is None:
        return CheckResult(Check.CAPACITY, subject, Status.PASS, "plain On-Demand capacity: no reservation to check")
    label = "Capacity Block" if capacity.kind is CapacityKind.CAPACITY_BLOCK else "capacity reservation"
    rid = capacity.reservation_id
    config_fix = f"or change capacity of group {group.name} in infra/spec/environments.py"
    if reservation is None:
        return CheckResult(
            Check.CAPACITY,
            subject,
            Status.FAIL,
            f"{label} {rid} not found in {region} (or not shared with this account)",
            f"check the id and region: aws ec2 describe-capacity-reservations --capacity-reservation-ids {rid} "
            f"--region {region}; {config_fix}",
        )
    state = str(reservation.get("State", "unknown"))
    count = reservation_instance_count(reservation)
    problems: list[str] = []
    if reservation.get("InstanceType") != group.instance_type:
        problems.append(f"it holds {reservation.get('InstanceType')}, the group launches {group.instance_type}")
    if reservation.get("AvailabilityZone") != zone:
        problems.append(f"it is in {reservation.get('AvailabilityZone')}, the GPU zone is {zone}")
    kind = reservation.get("ReservationType")
    expected_kind = "capacity-block" if capacity.kind is CapacityKind.CAPACITY_BLOCK else "default"
    if kind is not None and kind != expected_kind:
        actual = "a Capacity Block" if kind == "capacity-block" else "an On-Demand Capacity Reservation"
        problems.append(f"it is {actual}, the group is declared {capacity.kind.value}")
    if count < nodes_needed:
        problems.append(f"it holds {count} instance(s), the node group(s) on it scale to {nodes_needed}")
    platform = reservation.get("InstancePlatform")
    if platform is not None and platform != "Linux/UNIX":
        problems.append(f"its platform is {platform}, EKS nodes need Linux/UNIX")
    if state not in READY_STATES | NOT_YET_STATES:
        problems.insert(0, f"it is {state}")
    end = reservation.get("EndDate")
    until = f" until {date_text(end)}" if end is not None else ""
    end_problem = block_end_problem(capacity.end_time, end)
    if end_problem is not None:
        problems.append(end_problem)
    if problems:
        return CheckResult(
            Check.CAPACITY,
            subject,
            Status.FAIL,
            f"{label} {rid}: " + "; ".join(problems),
            f"use a {label} that is active or scheduled, in {zone}, for {nodes_needed} x {group.instance_type}; "
            + config_fix,
        )
    if state in NOT_YET_STATES:
        start = reservation.get("StartDate")
        starts = f", starts {date_text(start)}" if start is not None else ""
        return CheckResult(
            Check.CAPACITY,
            subject,
            Status.WARN,
            f"{label} {rid} is {state}{starts}{until}: {count} x {group.instance_type} in {zone}; "
            "nodes cannot launch before it is active",
            "deploy now and let the nodes start when it becomes active, or deploy after the start date",
        )
    available = reservation.get("AvailableInstanceCount")
    if isinstance(available, int) and available < nodes_needed:
        return CheckResult(
            Check.CAPACITY,
            subject,
            Status.WARN,
            f"{label} {rid} active{until}, but only {available} of {count} instance(s) unused "
            f"(the group scales to {nodes_needed})",
            "see what runs in it: aws ec2 describe-instances "
            f"--filters Name=capacity-reservation-id,Values={rid} --region {region}",
        )
    return CheckResult(
        Check.CAPACITY,
        subject,
        Status.PASS,
        f"{label} {rid} active{until}: {count} x {group.instance_type} in {zone} (needs {nodes_needed})",
    )


def block_end_problem(declared: datetime | None, end_date: object) -> str | None:
    """capacity.end against the block's EndDate: jobs on the group stop CAPACITY_BLOCK_STOP_MARGIN before the declared
    end (training/deadline.py), so a later EndDate (an extended block) wastes the time between, an earlier one loses
    work when EC2 terminates the instances. Unset: nothing to compare (the NVRx chart refuses a job on the group)."""
    if declared is None or not isinstance(end_date, datetime):
        return None
    actual = end_date if end_date.tzinfo is not None else end_date.replace(tzinfo=declared.tzinfo)
    if actual == declared:
        return None
    return f"it ends {actual.isoformat()}, capacity.end says {declared.isoformat()} (set capacity.end to its EndDate)"


def placement_group_of(reservation: Mapping[str, Any]) -> str | None:
    """The name in PlacementGroupArn (arn:aws:ec2:<region>:<account>:placement-group/<name>), if any."""
    arn = reservation.get("PlacementGroupArn")
    if not arn:
        return None
    return str(arn).rpartition("placement-group/")[2] or str(arn)


def evaluate_placement(group: GpuNodeGroupConfig, reservation: Mapping[str, Any]) -> CheckResult:
    """A reservation created in a cluster placement group serves only instances launched into that group
    (EC2 user guide, "Capacity Reservations in cluster placement groups"; DescribeCapacityReservations
    returns the group as PlacementGroupArn). The launch template sets the group from
    capacity.placement_group_name, so the two must name the same group, or neither any."""
    subject = group_subject(group)
    rid = group.capacity.reservation_id
    reserved_in = placement_group_of(reservation)
    declared = group.capacity.placement_group_name
    field_name = f"capacity.placement_group_name of group {group.name} (infra/spec/environments.py)"
    if reserved_in == declared:
        if declared is None:
            return CheckResult(
                Check.PLACEMENT, subject, Status.PASS, f"{rid} is not in a placement group and the group names none"
            )
        return CheckResult(
            Check.PLACEMENT,
            subject,
            Status.PASS,
            f"{rid} was created in cluster placement group {declared}, which the group launches into",
        )
    if reserved_in is not None:
        launched = f"names {declared}" if declared is not None else "names none"
        return CheckResult(
            Check.PLACEMENT,
            subject,
            Status.FAIL,
            f"{rid} was created in cluster placement group {reserved_in} ({reservation.get('PlacementGroupArn')}); "
            f"only instances launched into that group use it, and the group {launched}",
            f"set {field_name} to {reserved_in!r}",
        )
    return CheckResult(
        Check.PLACEMENT,
        subject,
        Status.FAIL,
        f"the group launches into placement group {declared}, but {rid} was not created in a placement group "
        "(it has no PlacementGroupArn), so the launch does not match the reservation",
        f"remove {field_name}, or use a reservation created in {declared}",
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    groups = env.gpu_node_groups
    zone = env.gpu_availability_zone
    region = aws.region
    results: list[CheckResult] = []
    reservations: dict[str, dict[str, Any] | None] = {}
    for group in groups:
        rid = group.capacity.reservation_id
        if rid is not None:
            say(f"{group.capacity.kind.value} {rid}")
        sharing = sum(g.scaling.max_size for g in groups if rid is not None and g.capacity.reservation_id == rid)

        def capacity(
            group: GpuNodeGroupConfig = group, rid: str | None = rid, sharing: int = sharing
        ) -> list[CheckResult]:
            if rid is not None and rid not in reservations:
                reservations[rid] = aws.capacity_reservation(rid)
            found = reservations.get(rid) if rid is not None else None
            return [evaluate_capacity(group, found, zone=zone, nodes_needed=sharing, region=region)]

        results += attempt(Check.CAPACITY, [group_subject(group)], region, capacity)
        if rid is None:
            continue

        def placement(group: GpuNodeGroupConfig = group, rid: str = rid) -> list[CheckResult]:
            if rid not in reservations:
                reservations[rid] = aws.capacity_reservation(rid)
            found = reservations[rid]
            return [] if found is None else [evaluate_placement(group, found)]  # None: the capacity row says

        results += attempt(Check.PLACEMENT, [group_subject(group)], region, placement)
    return results

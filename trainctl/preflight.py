"""`trainctl preflight`: before `cdk deploy`, ask AWS whether an environment can be built as declared.

    trainctl preflight --env prod                  the checks as a table, in prod's own region
    trainctl preflight --env prod --json           one JSON document, for machines
    trainctl preflight --env dev --region us-east-1
                                                   another region (warned: the zone names are dev's)

Read-only calls with the caller's credentials (environment, AWS_PROFILE or --profile, SSO,
instance role); the declarations come from infra/spec (environments, instances, versions):

  offering    each GPU instance type is offered in the GPU zone       ec2:DescribeInstanceTypeOfferings
  instance    EFA supported; EFA interfaces and network cards cover   ec2:DescribeInstanceTypes
              what the node group attaches; GPUs and vCPUs as in
              infra/spec/instances.py
  quota       On-Demand vCPU quotas, P (L-417A185B) and G and VT      servicequotas:GetServiceQuota
              (L-DB2E81BA), cover the on-demand GPU groups at max
              size plus a rolling update's surge node
  capacity    a configured reservation or Capacity Block exists, is   ec2:DescribeCapacityReservations
              active (or scheduled), and matches type, zone, count
  kubernetes  EKS offers KUBERNETES_VERSION in the region             eks:DescribeClusterVersions
  add-on      EKS offers each pinned managed add-on version for it    eks:DescribeAddonVersions
  subnet      if the VPC is deployed: each private subnet has free    ec2:DescribeVpcs, DescribeSubnets,
              addresses for its nodes' interfaces and pods                DescribeInstances
  placement   a reservation made in a cluster placement group is      ec2:DescribeCapacityReservations
              launched into that group (capacity.placement_group_name)
  admin       each cluster.admin_principals entry exists (EKS        sts:GetCallerIdentity, iam:GetRole,
              refuses an access entry for a missing one)                  iam:GetUser
  chart       each pinned Helm chart version (versions.py             HTTP GET <repository>/index.yaml;
              HELM_CHARTS) is listed in its repository's index,           oci://: HEAD /v2/<chart>/manifests/
              or (an oci:// chart) its tag exists in the registry         <version> (OCI distribution API)
  leftover    what an earlier deployment left: an EKS cluster, or a   cloudformation:ListStackResources,
              GPU node group, of the fixed name outside its stack         eks:DescribeCluster, Describe-
              (blocks), retained FSx file systems outside the storage     Nodegroup, fsx:DescribeFileSystems,
              stack (cost), the control-plane log group (adopted)         logs:DescribeLogGroups

One row per check and subject: PASS, WARN (deployable, but read the reason) or FAIL, with the
reason and the fix. A check that could not run (no credentials, endpoint unreachable, access
denied) is a NOT RUN row (no verdict, never FAIL) whose reason starts with "could not run:".
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TextIO

from infra.spec import ENVIRONMENTS, ConfigError, Environment, GpuNodeGroupConfig, get_environment
from infra.spec.addressing import (
    AWS_RESERVED_PER_SUBNET,
    ROLLING_UPDATE_SURGE,
    addresses_per_node,
    gpu_zone_demand,
    subnet_overhead,
)
from infra.spec.efa import efa_layout
from infra.spec.environments import CapacityKind
from infra.spec.replacement_names import gpu_nodegroup_name
from infra.spec.versions import CORE_ADDONS, HELM_CHARTS, KUBERNETES_VERSION, MANAGED_ADDONS, HelmChartPin
from trainctl.arguments import keyed_url
from trainctl.aws import ALL_SERVICES, SERVICES, Aws, AwsError, ErrorKind
from trainctl.exit_codes import ExitCode
from trainctl.helm_repo import DEFAULT_TIMEOUT as CHART_TIMEOUT
from trainctl.helm_repo import ChartIndex, ChartRepoError, RepoErrorKind, check_oci_chart, fetch_index, is_oci, newest
from trainctl.output import NOT_RUN, table, to_json

# infra/stage.py tags every resource of an environment's stack with this key and the environment's name.
ENVIRONMENT_TAG = "platform:environment"
# CloudFormation tags what a stack creates with the stack's name (infra/stage.py: <cluster>-platform).
STACK_NAME_TAG = "aws:cloudformation:stack-name"

# --chart-repository without a pin name: every pinned chart is fetched from that URL.
ALL_CHARTS = "*"

# Managed add-ons outside CORE_ADDONS, and whether an environment installs them (infra/addons/).
OPTIONAL_ADDONS: Mapping[str, Callable[[Environment], bool]] = {
    "aws-fsx-csi-driver": lambda env: env.add_ons.checkpoint_storage is not None,
    "eks-node-monitoring-agent": lambda env: env.add_ons.node_monitoring_agent,
}


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    NOT_RUN = NOT_RUN


class Check(StrEnum):
    OFFERING = "offering"
    INSTANCE = "instance"
    QUOTA = "quota"
    CAPACITY = "capacity"
    KUBERNETES = "kubernetes"
    ADDON = "add-on"
    SUBNET = "subnet"
    PLACEMENT = "placement"
    ADMIN = "admin"
    CHART = "chart"
    LEFTOVER = "leftover"


API: Mapping[Check, str] = {
    Check.OFFERING: "ec2:DescribeInstanceTypeOfferings",
    Check.INSTANCE: "ec2:DescribeInstanceTypes",
    Check.QUOTA: "servicequotas:GetServiceQuota",
    Check.CAPACITY: "ec2:DescribeCapacityReservations",
    Check.KUBERNETES: "eks:DescribeClusterVersions",
    Check.ADDON: "eks:DescribeAddonVersions",
    Check.SUBNET: "ec2:DescribeVpcs, ec2:DescribeSubnets, ec2:DescribeInstances",
    Check.PLACEMENT: "ec2:DescribeCapacityReservations",
    Check.ADMIN: "sts:GetCallerIdentity, iam:GetRole, iam:GetUser",
    Check.CHART: "HTTP GET <repository>/index.yaml; oci:// charts: HEAD /v2/<chart>/manifests/<version>",
    Check.LEFTOVER: "cloudformation:ListStackResources, eks:DescribeCluster, eks:DescribeNodegroup, "
    "logs:DescribeLogGroups, fsx:DescribeFileSystems",
}


@dataclass(frozen=True)
class CheckResult:
    check: Check
    subject: str
    status: Status
    reason: str
    fix: str | None = None
    error_kind: str | None = None
    """Set (a trainctl.aws.ErrorKind, or a trainctl.helm_repo.RepoErrorKind for the chart check) when the
    check could not run; its status is then NOT_RUN."""

    @property
    def ran(self) -> bool:
        return self.error_kind is None

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check.value,
            "subject": self.subject,
            "status": self.status.value,
            "reason": self.reason,
            "fix": self.fix,
            "api": API[self.check],
            "ran": self.ran,
            "error_kind": self.error_kind,
        }


def could_not_run(check: Check, subject: str, error: AwsError, region: str) -> CheckResult:
    fixes = {
        ErrorKind.NO_CREDENTIALS: "configure credentials (aws configure, aws sso login, AWS_PROFILE or --profile) "
        "and run again",
        ErrorKind.INVALID_CREDENTIALS: "refresh the credentials (an expired session?) and run again",
        ErrorKind.UNREACHABLE: f"check network access to the AWS endpoints of {region} (proxy, VPN, region name)",
        ErrorKind.ACCESS_DENIED: f"allow {error.api} (read-only) for the caller, or run as a role that has it",
        ErrorKind.UNSUPPORTED: "upgrade boto3 and botocore; the installed version lacks this API",
    }
    return CheckResult(
        check,
        subject,
        Status.NOT_RUN,
        f"could not run: {error.api}: {error}",
        fixes.get(error.kind, "run again; if it persists, look the error code up"),
        error.kind.value,
    )


def _group_subject(group: GpuNodeGroupConfig) -> str:
    return f"{group.name} ({group.instance_type})"


def _date(value: object) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else str(value)


# --- 1. instance type offered in the GPU zone ---------------------------------------------------


def evaluate_offering(group: GpuNodeGroupConfig, zone: str, offered: Iterable[str], region: str) -> CheckResult:
    if group.instance_type in set(offered):
        return CheckResult(Check.OFFERING, _group_subject(group), Status.PASS, f"offered in {zone}")
    return CheckResult(
        Check.OFFERING,
        _group_subject(group),
        Status.FAIL,
        f"{group.instance_type} is not offered in {zone} (region {region})",
        f"set gpu_availability_zone (infra/spec/environments.py) to a zone of the VPC that offers it: "
        f"aws ec2 describe-instance-type-offerings --location-type availability-zone "
        f"--filters Name=instance-type,Values={group.instance_type} --region {region}; or pick another type",
    )


# --- 2. EFA, network cards, GPUs: EC2's view against infra/spec/instances.py ---------------------


def evaluate_instance(group: GpuNodeGroupConfig, info: Mapping[str, Any] | None, region: str) -> CheckResult:
    subject = _group_subject(group)
    facts = group.instance
    # GpuNodeGroupConfig validates both.
    assert facts.gpu is not None
    assert facts.efa is not None
    if info is None:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.FAIL,
            f"EC2 in {region} does not know {group.instance_type}",
            "pick an instance type EC2 offers in the region (aws ec2 describe-instance-types)",
        )
    attached = group.efa_interface_count
    cards_used = max(slot.network_card_index for slot in efa_layout(facts, attached)) + 1
    network = info.get("NetworkInfo", {})
    efa_supported = network.get("EfaSupported") is True
    max_efa = network.get("EfaInfo", {}).get("MaximumEfaInterfaces")
    cards = network.get("MaximumNetworkCards")
    gpus = sum(int(g.get("Count", 0)) for g in info.get("GpuInfo", {}).get("Gpus", []))
    vcpus = info.get("VCpuInfo", {}).get("DefaultVCpus")

    failures: list[str] = []
    if not efa_supported:
        failures.append("EC2 reports no EFA support (NetworkInfo.EfaSupported)")
    elif max_efa is None or max_efa < attached:
        failures.append(
            f"the node group attaches {attached} EFA interface(s), EC2 allows {max_efa} (EfaInfo.MaximumEfaInterfaces)"
        )
    if cards is None or cards < cards_used:
        failures.append(f"the interface layout uses {cards_used} network card(s), EC2 reports {cards}")
    if gpus != facts.gpu.count:
        failures.append(
            f"EC2 reports {gpus} GPU(s), infra/spec/instances.py {facts.gpu.count} (jobs request GPUs by that number)"
        )
    if failures:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.FAIL,
            "; ".join(failures),
            f"correct the facts of {group.instance_type} in infra/spec/instances.py from "
            f"`aws ec2 describe-instance-types --instance-types {group.instance_type}`"
            + (f", or set efa_interfaces of group {group.name} to at most {max_efa}" if max_efa else ""),
        )
    drift = [
        f"{what} {actual} (facts: {declared})"
        for what, actual, declared in (
            ("MaximumEfaInterfaces", max_efa, facts.efa.max_interfaces),
            ("MaximumNetworkCards", cards, facts.network_cards),
            ("DefaultVCpus", vcpus, facts.vcpus),
        )
        if actual != declared
    ]
    if drift:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.WARN,
            "the node group fits, but EC2 differs from infra/spec/instances.py: " + ", ".join(drift),
            f"update the facts of {group.instance_type} in infra/spec/instances.py (quota and address "
            "arithmetic derive from them)",
        )
    return CheckResult(
        Check.INSTANCE,
        subject,
        Status.PASS,
        f"EFA: attaches {attached} of {max_efa} interface(s) on {cards_used} of {cards} network card(s); "
        f"{gpus} GPUs, {vcpus} vCPUs as declared",
    )


# --- 3. On-Demand vCPU quotas ------------------------------------------------------------------


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
            _group_subject(group),
            Status.PASS,
            f"skipped: runs on {group.capacity.kind.value} {group.capacity.reservation_id} (see the capacity row)",
        )
    return CheckResult(
        Check.QUOTA,
        _group_subject(group),
        Status.WARN,
        f"no On-Demand vCPU quota known for the family of {group.instance_type}",
        "check its quota in the Service Quotas console (EC2) by hand",
    )


# --- 4. capacity reservations and Capacity Blocks ------------------------------------------------

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
    subject = _group_subject(group)
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
    until = f" until {_date(end)}" if end is not None else ""
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
        starts = f", starts {_date(start)}" if start is not None else ""
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


# --- 4b. the reservation's cluster placement group ------------------------------------------------


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
    subject = _group_subject(group)
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


# --- 5. Kubernetes version and managed add-ons ---------------------------------------------------


def evaluate_kubernetes(version: str, entries: Sequence[Mapping[str, Any]], region: str) -> CheckResult:
    subject = f"Kubernetes {version}"
    fix_version = (
        f"set KUBERNETES_VERSION in infra/spec/versions.py to a version EKS offers "
        f"(aws eks describe-cluster-versions --region {region}), with the matching kubectl layer"
    )
    entry = next((e for e in entries if e.get("clusterVersion") == version), None)
    if entry is None:
        return CheckResult(
            Check.KUBERNETES, subject, Status.FAIL, f"EKS in {region} does not offer Kubernetes {version}", fix_version
        )
    status = str(entry.get("versionStatus") or entry.get("status") or "").upper().replace("-", "_")
    standard_end = entry.get("endOfStandardSupportDate")
    extended_end = entry.get("endOfExtendedSupportDate")
    if status == "STANDARD_SUPPORT":
        until = f" until {_date(standard_end)}" if standard_end is not None else ""
        return CheckResult(Check.KUBERNETES, subject, Status.PASS, f"in standard support{until}")
    if status == "EXTENDED_SUPPORT":
        until = f" until {_date(extended_end)}" if extended_end is not None else ""
        return CheckResult(
            Check.KUBERNETES,
            subject,
            Status.WARN,
            f"in extended support{until} (charged extra per cluster hour)",
            "plan the upgrade: " + fix_version,
        )
    return CheckResult(
        Check.KUBERNETES,
        subject,
        Status.FAIL,
        f"EKS reports it {status.lower().replace('_', ' ') or 'with no support status'}",
        fix_version,
    )


def environment_addons(env: Environment) -> list[str]:
    """The managed add-ons the environment installs, in MANAGED_ADDONS order."""
    return [
        name
        for name in MANAGED_ADDONS
        if name in CORE_ADDONS or name not in OPTIONAL_ADDONS or OPTIONAL_ADDONS[name](env)
    ]


def evaluate_addon(name: str, pinned: str, kubernetes_version: str, offered: Sequence[str]) -> CheckResult:
    subject = f"{name} {pinned}"
    if pinned in offered:
        return CheckResult(Check.ADDON, subject, Status.PASS, f"offered for Kubernetes {kubernetes_version}")
    fix = (
        f"pin an offered version in MANAGED_ADDONS (infra/spec/versions.py): aws eks describe-addon-versions "
        f"--kubernetes-version {kubernetes_version} --addon-name {name}"
    )
    if not offered:
        return CheckResult(
            Check.ADDON, subject, Status.FAIL, f"EKS offers no {name} version for Kubernetes {kubernetes_version}", fix
        )
    shown = ", ".join(offered[:3]) + (", ..." if len(offered) > 3 else "")
    return CheckResult(
        Check.ADDON,
        subject,
        Status.FAIL,
        f"not offered for Kubernetes {kubernetes_version} (offered: {shown})",
        fix,
    )


# --- 6. free addresses in the private subnets ---------------------------------------------------


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


# --- 7. admin principals exist --------------------------------------------------------------------

_PRINCIPAL = re.compile(r"^arn:[^:]+:iam::(?P<account>\d{12}):(?P<kind>role|user)/(?:[^/]+/)*(?P<name>[^/]+)$")


@dataclass(frozen=True)
class AdminPrincipal:
    given: str
    kind: str
    """"role" or "user"."""
    name: str
    account: str | None
    """The ARN's account; None for a bare role name, which resolves in the deploying account."""


def parse_principal(text: str) -> AdminPrincipal:
    """An entry of cluster.admin_principals (ClusterConfig validated its shape): a role name or an ARN."""
    match = _PRINCIPAL.match(text)
    if match is None:
        return AdminPrincipal(given=text, kind="role", name=text, account=None)
    return AdminPrincipal(given=text, kind=match["kind"], name=match["name"], account=match["account"])


def evaluate_admin(principal: AdminPrincipal, found: Mapping[str, Any] | None, *, caller_account: str) -> CheckResult:
    """EKS refuses an access entry whose principal does not exist ("The specified principalArn is invalid"),
    which fails the cluster stack's create and rolls it back (REFERENCE.md, deploy behaviour)."""
    subject = principal.given
    field_fix = "or change cluster.admin_principals in infra/spec/environments.py"
    if principal.account is not None and principal.account != caller_account:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.WARN,
            f"{principal.kind} {principal.name} is in account {principal.account}, the credentials are account "
            f"{caller_account}'s: not looked up",
            f"run preflight with credentials of account {principal.account}, or check it there: "
            f"aws iam get-{principal.kind} --{principal.kind}-name {principal.name}",
        )
    where = f"account {caller_account}"
    if found is None:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.FAIL,
            f"no IAM {principal.kind} named {principal.name} in {where}: EKS rejects its access entry "
            '("The specified principalArn is invalid") and the cluster\'s stack rolls back',
            f"create the {principal.kind} in {where} (aws iam create-{principal.kind} "
            f"--{principal.kind}-name {principal.name} ...), {field_fix}",
        )
    arn = str(found.get("Arn", ""))
    if principal.account is not None and arn != principal.given:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.FAIL,
            f"nothing at that ARN: the {principal.kind} named {principal.name} in {where} is {arn} (another path)",
            f"write the ARN exactly as IAM reports it ({arn}), {field_fix}",
        )
    return CheckResult(Check.ADMIN, subject, Status.PASS, f"{principal.kind} exists: {arn}")


def admin_checks(env: Environment, aws: Aws, *, region: str) -> list[CheckResult]:
    principals = [parse_principal(p) for p in env.cluster.admin_principals]
    results: list[CheckResult] = []
    account: list[str] = []

    for principal in principals:

        def one(principal: AdminPrincipal = principal) -> list[CheckResult]:
            if not account:
                account.append(aws.caller_account())
            if principal.account is not None and principal.account != account[0]:
                return [evaluate_admin(principal, None, caller_account=account[0])]
            lookup = aws.iam_role if principal.kind == "role" else aws.iam_user
            return [evaluate_admin(principal, lookup(principal.name), caller_account=account[0])]

        _attempt(results, Check.ADMIN, [principal.given], region, one)
    return results


# --- 8. pinned Helm chart versions exist in their repositories -------------------------------------


def _chart_subject(pin: HelmChartPin) -> str:
    return f"{pin.chart} {pin.version}"


def evaluate_chart(name: str, pin: HelmChartPin, index: ChartIndex) -> CheckResult:
    """The exact pinned string must be listed. Helm itself resolves `--version` by exact string first,
    then as a semver constraint (helm/helm pkg/repo/index.go, IndexFile.Get), so "0.5.32" would still
    install "v0.5.32"; such a near miss is a WARN that says so, not a PASS."""
    subject = _chart_subject(pin)
    pin_fix = f"pin a listed version of {name} in HELM_CHARTS (infra/spec/versions.py)"
    versions = index.versions(pin.chart)
    if versions is None:
        return CheckResult(
            Check.CHART,
            subject,
            Status.FAIL,
            f"{index.url} has no chart named {pin.chart} ({len(index.entries)} charts listed)",
            f"correct chart or repository of {name} in HELM_CHARTS (infra/spec/versions.py)",
        )
    if pin.version in versions:
        return CheckResult(Check.CHART, subject, Status.PASS, f"listed in {index.url}")
    shown = ", ".join(newest(versions)) or "none"
    other = pin.version[1:] if pin.version.startswith("v") else f"v{pin.version}"
    if other in versions:
        return CheckResult(
            Check.CHART,
            subject,
            Status.WARN,
            f"{pin.version!r} is not listed, {other!r} is (Helm's semver match would install it); newest: {shown}",
            f"pin the exact string {other!r} for {name} in HELM_CHARTS (infra/spec/versions.py)",
        )
    return CheckResult(
        Check.CHART,
        subject,
        Status.FAIL,
        f"version {pin.version!r} is not in {index.url}: the Helm install fails inside CloudFormation and "
        f"rolls the stack back; newest listed: {shown}",
        pin_fix,
    )


def chart_not_fetched(pin: HelmChartPin, error: ChartRepoError) -> CheckResult:
    """A 404 is the repository's answer (no index at that URL: Helm fails the same way); anything else
    leaves the check without a verdict."""
    subject = _chart_subject(pin)
    if error.kind is RepoErrorKind.NOT_FOUND:
        return CheckResult(
            Check.CHART,
            subject,
            Status.FAIL,
            f"no Helm repository index: {error}",
            f"correct the repository of {pin.chart} in HELM_CHARTS (infra/spec/versions.py)",
        )
    fixes = {
        RepoErrorKind.UNREACHABLE: f"check network access to {error.url} (proxy, firewall) and run again",
        RepoErrorKind.HTTP_ERROR: "run again later; if it persists, open the URL in a browser",
        RepoErrorKind.MALFORMED: f"open {error.url}: a proxy or login page may be answering instead of the repository",
        RepoErrorKind.TOO_LARGE: "run again with a larger cap, or check the URL names a chart repository",
    }
    reason = f"could not run: {error}"
    return CheckResult(Check.CHART, subject, Status.NOT_RUN, reason, fixes[error.kind], error.kind.value)


def oci_chart_check(name: str, pin: HelmChartPin, repository: str, *, timeout: float) -> CheckResult:
    """A chart published only to an OCI registry (no index.yaml): the pinned version's tag must exist."""
    subject = _chart_subject(pin)
    try:
        digest = check_oci_chart(repository, pin.version, timeout=timeout)
    except ChartRepoError as error:
        if error.kind is RepoErrorKind.NOT_FOUND:
            return CheckResult(
                Check.CHART,
                subject,
                Status.FAIL,
                f"version {pin.version!r} is not published in {repository}: the Helm install fails inside "
                f"CloudFormation and rolls the stack back ({error})",
                f"pin a published version of {name} in HELM_CHARTS (infra/spec/versions.py)",
            )
        return chart_not_fetched(pin, error)
    return CheckResult(Check.CHART, subject, Status.PASS, f"published in {repository} as {digest}")


def chart_checks(overrides: Mapping[str, str], *, timeout: float, say: Callable[[str], None]) -> list[CheckResult]:
    """`overrides`: pin name (a HELM_CHARTS key) or "*" -> the repository URL to ask instead
    (an oci:// chart reference is asked through the registry API)."""
    results: list[CheckResult] = []
    fetched: dict[str, ChartIndex | ChartRepoError] = {}
    for name, pin in HELM_CHARTS.items():
        repository = overrides.get(name) or overrides.get(ALL_CHARTS) or pin.repository
        if is_oci(repository):
            say(f"chart registry {repository}")
            results.append(oci_chart_check(name, pin, repository, timeout=timeout))
            continue
        if repository not in fetched:
            say(f"chart repository {repository}")
            try:
                fetched[repository] = fetch_index(repository, timeout=timeout)
            except ChartRepoError as exc:
                fetched[repository] = exc
        answer = fetched[repository]
        if isinstance(answer, ChartRepoError):
            results.append(chart_not_fetched(pin, answer))
        else:
            results.append(evaluate_chart(name, pin, answer))
    return results


# --- 9. leftovers of an earlier deployment that would block or cost -------------------------------


def platform_stack_name(env: Environment) -> str:
    return f"{env.cluster.name}-platform"


def storage_stack_name(env: Environment) -> str:
    return f"{env.cluster.name}-storage"


def control_plane_log_group(env: Environment) -> str:
    """The name EKS writes control-plane logs to (EKS user guide, control-plane logs); fixed by AWS."""
    return f"/aws/eks/{env.cluster.name}/cluster"


def live_ids(resources: Sequence[Mapping[str, Any]] | None, resource_type: str) -> set[str]:
    """Physical ids of a stack's resources of one type that the stack still holds. A stack rolled back
    after its first create lists them DELETE_COMPLETE, or DELETE_SKIPPED where retained."""
    return {
        str(r.get("PhysicalResourceId"))
        for r in resources or ()
        if r.get("ResourceType") == resource_type and not str(r.get("ResourceStatus", "")).startswith("DELETE_")
    }


def evaluate_cluster_leftover(
    env: Environment, cluster: Mapping[str, Any] | None, stack_resources: Sequence[Mapping[str, Any]] | None
) -> CheckResult:
    name = env.cluster.name
    stack = platform_stack_name(env)
    subject = f"EKS cluster {name}"
    if cluster is None:
        return CheckResult(
            Check.LEFTOVER, subject, Status.PASS, "none of that name in the region: the deploy creates it"
        )
    if name in live_ids(stack_resources, "AWS::EKS::Cluster"):
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack}: the deploy updates it")
    owner = "does not exist" if stack_resources is None else "does not hold it"
    return CheckResult(
        Check.LEFTOVER,
        subject,
        Status.FAIL,
        f"a cluster of that name exists ({cluster.get('status', 'status unknown')}, created "
        f"{_date(cluster.get('createdAt'))}) and stack {stack} {owner}: creating it fails (ResourceInUseException) "
        "and rolls the stack back",
        f"if it is a leftover, delete its node groups and then it (aws eks delete-cluster --name {name} "
        f"--region {env.region}); or change cluster.name in infra/spec/environments.py",
    )


def evaluate_log_group(env: Environment, group: Mapping[str, Any] | None) -> CheckResult:
    """The stack adopts the control-plane log group (infra/cluster.py: a LogRetention on the fixed
    name, which creates it when missing and sets retention on one that exists) instead of creating
    it, so one left by an earlier deployment, or written by EKS itself, does not block a create."""
    name = control_plane_log_group(env)
    days = env.cluster.control_plane_log_retention_days
    if group is None:
        return CheckResult(
            Check.LEFTOVER, f"log group {name}", Status.PASS, f"does not exist: the deploy creates it ({days} days)"
        )
    kept = group.get("retentionInDays")
    now = f"{kept} days" if kept is not None else "never expires"
    return CheckResult(
        Check.LEFTOVER,
        f"log group {name}",
        Status.PASS,
        f"exists ({now}, {group.get('storedBytes', 0)} bytes): the deploy adopts it and sets {days} days",
    )


def evaluate_file_systems(
    env: Environment,
    file_systems: Sequence[Mapping[str, Any]],
    storage: Sequence[Mapping[str, Any]] | None,
    platform: Sequence[Mapping[str, Any]] | None,
) -> list[CheckResult]:
    """A retained FSx file system (RemovalPolicy.RETAIN) outlives its stack and keeps costing; a new
    deploy does not fail on it but creates a second one beside it."""
    tag = f"{ENVIRONMENT_TAG}={env.name}"
    stack = storage_stack_name(env)
    owned = live_ids(storage, "AWS::FSx::FileSystem")
    in_platform = live_ids(platform, "AWS::FSx::FileSystem")
    results = []
    for fs in file_systems:
        fs_id = str(fs.get("FileSystemId"))
        size = f"{fs.get('StorageCapacity')} GiB, {fs.get('Lifecycle', 'lifecycle unknown')}"
        subject = f"FSx {fs_id}"
        if fs_id in owned:
            results.append(CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack} ({size})"))
            continue
        keep = (
            f"import it into {stack} (cdk import) to keep its data, or copy what you need and delete it "
            f"(aws fsx delete-file-system --file-system-id {fs_id} --region {env.region})"
        )
        if fs_id in in_platform:
            results.append(
                CheckResult(
                    Check.LEFTOVER,
                    subject,
                    Status.WARN,
                    f"belongs to stack {platform_stack_name(env)} (the layout before the storage stack, {size}): "
                    f"the deploy leaves it behind (retained) and {stack} creates a new one",
                    keep,
                )
            )
            continue
        owner = "does not exist" if storage is None else "does not hold it"
        results.append(
            CheckResult(
                Check.LEFTOVER,
                subject,
                Status.WARN,
                f"tagged {tag} ({size}), but stack {stack} {owner}: a retained leftover that keeps costing; "
                "the deploy creates a second file system beside it",
                keep,
            )
        )
    if not results:
        results.append(CheckResult(Check.LEFTOVER, "FSx file systems", Status.PASS, f"no file system tagged {tag}"))
    return results


def gpu_stack_name(env: Environment, group: GpuNodeGroupConfig) -> str:
    return f"{env.cluster.name}-gpu-{group.name}"


def evaluate_nodegroup_leftover(
    env: Environment,
    group: GpuNodeGroupConfig,
    nodegroup: Mapping[str, Any] | None,
    stack_resources: Sequence[Mapping[str, Any]] | None,
    platform_resources: Sequence[Mapping[str, Any]] | None,
) -> CheckResult:
    """GPU node groups have fixed names (<cluster>-<group>-<zone>-<od|cb>, infra/spec/replacement_names.py)
    and live in their own stack.
    One that outlived its stack (a delete that failed, a hand-made one) makes the stack's create fail:
    node group names are unique within a cluster (CreateNodegroup: ResourceInUseException)."""
    name = gpu_nodegroup_name(env, group)
    stack = gpu_stack_name(env, group)
    subject = f"node group {name}"
    if nodegroup is None:
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"none in cluster {env.cluster.name}")
    # CloudFormation's physical id (Ref) of an AWS::EKS::Nodegroup is "<cluster>/<nodegroup>" (aws/aws-cdk#22442).
    physical = f"{env.cluster.name}/{name}"
    if physical in live_ids(stack_resources, "AWS::EKS::Nodegroup"):
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack}: the deploy updates it")
    if physical in live_ids(platform_resources, "AWS::EKS::Nodegroup"):
        return CheckResult(
            Check.LEFTOVER,
            subject,
            Status.WARN,
            f"belongs to stack {platform_stack_name(env)} (the layout before the GPU stacks): updating that stack "
            f"deletes it and its instances, then {stack} creates it again",
            "drain the group's jobs before the deploy",
        )
    owner = "does not exist" if stack_resources is None else "does not hold it"
    return CheckResult(
        Check.LEFTOVER,
        subject,
        Status.FAIL,
        f"exists ({nodegroup.get('status', 'status unknown')}) and stack {stack} {owner}: creating it fails "
        "(ResourceInUseException) and rolls the stack back",
        f"delete it (aws eks delete-nodegroup --cluster-name {env.cluster.name} --nodegroup-name {name} "
        f"--region {env.region}), or rename the group in infra/spec/environments.py",
    )


def leftover_checks(env: Environment, aws: Aws, *, region: str, say: Callable[[str], None]) -> list[CheckResult]:
    results: list[CheckResult] = []
    stacks: dict[str, list[dict[str, Any]] | None] = {}

    def resources(stack: str) -> list[dict[str, Any]] | None:
        if stack not in stacks:
            stacks[stack] = aws.stack_resources(stack)
        return stacks[stack]

    say(f"leftovers of earlier deployments of {env.cluster.name}")
    cluster: list[dict[str, Any] | None] = []

    def cluster_check() -> list[CheckResult]:
        cluster.append(aws.eks_cluster(env.cluster.name))
        return [evaluate_cluster_leftover(env, cluster[0], resources(platform_stack_name(env)))]

    _attempt(results, Check.LEFTOVER, [f"EKS cluster {env.cluster.name}"], region, cluster_check)
    if cluster and cluster[0] is not None:  # node groups exist only inside a cluster
        for group in env.gpu_node_groups:

            def nodegroup_check(group: GpuNodeGroupConfig = group) -> list[CheckResult]:
                name = gpu_nodegroup_name(env, group)
                found = aws.eks_nodegroup(env.cluster.name, name)
                if found is None:
                    return [evaluate_nodegroup_leftover(env, group, None, None, None)]
                own, platform = resources(gpu_stack_name(env, group)), resources(platform_stack_name(env))
                return [evaluate_nodegroup_leftover(env, group, found, own, platform)]

            name = f"node group {gpu_nodegroup_name(env, group)}"
            _attempt(results, Check.LEFTOVER, [name], region, nodegroup_check)
    _attempt(
        results,
        Check.LEFTOVER,
        [f"log group {control_plane_log_group(env)}"],
        region,
        lambda: [evaluate_log_group(env, aws.log_group(control_plane_log_group(env)))],
    )
    _attempt(
        results,
        Check.LEFTOVER,
        ["FSx file systems"],
        region,
        lambda: evaluate_file_systems(
            env,
            aws.file_systems_tagged(ENVIRONMENT_TAG, env.name),
            resources(storage_stack_name(env)),
            resources(platform_stack_name(env)),
        ),
    )
    return results


# --- running the checks ------------------------------------------------------------------------

Progress = Callable[[str], None]


def _attempt(
    results: list[CheckResult],
    check: Check,
    subjects: Sequence[str],
    region: str,
    action: Callable[[], list[CheckResult]],
) -> None:
    """Run one check's calls; if they fail, one could-not-run row per subject."""
    try:
        results.extend(action())
    except AwsError as exc:
        results.extend(could_not_run(check, subject, exc, region) for subject in subjects)


def run_checks(
    env: Environment,
    aws: Aws,
    *,
    chart_repositories: Mapping[str, str] | None = None,
    chart_timeout: float = CHART_TIMEOUT,
    progress: Progress | None = None,
) -> list[CheckResult]:
    """Every check of the environment against `aws.region`; never raises for an AWS or HTTP failure.

    `chart_repositories`: a HELM_CHARTS key (or "*" for all) -> a repository URL to ask instead of the
    pinned one (a mirror, or a test's server)."""
    region = aws.region
    zone = env.gpu_availability_zone
    groups = env.gpu_node_groups
    subjects = [_group_subject(g) for g in groups]
    results: list[CheckResult] = []

    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    if groups:
        say(f"instance type offerings in {zone}")

        def offering() -> list[CheckResult]:
            offered = aws.offered_instance_types(zone, sorted({g.instance_type for g in groups}))
            return [evaluate_offering(g, zone, offered, region) for g in groups]

        _attempt(results, Check.OFFERING, subjects, region, offering)
        infos: dict[str, dict[str, Any] | None] = {}
        for group in groups:
            say(f"EFA and GPUs of {group.instance_type}")

            def instance(group: GpuNodeGroupConfig = group) -> list[CheckResult]:
                if group.instance_type not in infos:
                    infos[group.instance_type] = aws.instance_type_info(group.instance_type)
                return [evaluate_instance(group, infos[group.instance_type], region)]

            _attempt(results, Check.INSTANCE, [_group_subject(group)], region, instance)

        on_demand = [g for g in groups if g.capacity.kind is CapacityKind.ON_DEMAND]
        for quota in VCPU_QUOTAS:
            members = [g for g in on_demand if quota_for(g.instance_type) is quota]
            if not members:
                continue
            say(f"quota {quota.code} ({quota.name})")

            def quota_check(quota: VcpuQuota = quota, members: list[GpuNodeGroupConfig] = members) -> list[CheckResult]:
                value = float(aws.service_quota(quota.code)["Value"])
                return [evaluate_quota(quota, members, value, region)]

            _attempt(results, Check.QUOTA, [f"{quota.code} ({quota.name})"], region, quota_check)
        results.extend(evaluate_unquoted(g) for g in groups if g not in on_demand or quota_for(g.instance_type) is None)

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

            _attempt(results, Check.CAPACITY, [_group_subject(group)], region, capacity)
            if rid is None:
                continue

            def placement(group: GpuNodeGroupConfig = group, rid: str = rid) -> list[CheckResult]:
                if rid not in reservations:
                    reservations[rid] = aws.capacity_reservation(rid)
                found = reservations[rid]
                return [] if found is None else [evaluate_placement(group, found)]  # None: the capacity row says

            _attempt(results, Check.PLACEMENT, [_group_subject(group)], region, placement)

    say(f"EKS support of Kubernetes {KUBERNETES_VERSION}")

    def kubernetes() -> list[CheckResult]:
        return [evaluate_kubernetes(KUBERNETES_VERSION, aws.cluster_versions(KUBERNETES_VERSION), region)]

    _attempt(results, Check.KUBERNETES, [f"Kubernetes {KUBERNETES_VERSION}"], region, kubernetes)
    for name in environment_addons(env):
        pinned = MANAGED_ADDONS[name]
        say(f"add-on {name} {pinned}")

        def addon(name: str = name, pinned: str = pinned) -> list[CheckResult]:
            offered = aws.addon_versions(name, KUBERNETES_VERSION)
            return [evaluate_addon(name, pinned, KUBERNETES_VERSION, offered)]

        _attempt(results, Check.ADDON, [f"{name} {pinned}"], region, addon)

    say("private subnets of the deployed VPC")
    _attempt(results, Check.SUBNET, ["vpc"], region, lambda: subnet_checks(env, aws))
    say("admin principals")
    results.extend(admin_checks(env, aws, region=region))
    results.extend(chart_checks(chart_repositories or {}, timeout=chart_timeout, say=say))
    results.extend(leftover_checks(env, aws, region=region, say=say))
    return results


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


# --- the report --------------------------------------------------------------------------------


@dataclass
class PreflightReport:
    environment: str
    region: str | None
    environment_region: str | None
    results: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Problems that kept every check from starting (an unknown environment)."""

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL and r.ran]

    @property
    def not_run(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ran]

    @property
    def exit_code(self) -> ExitCode:
        """1 when a check ran and failed (even if others could not run): there is something to fix.
        2 when nothing failed but some check could not run, or none could start: no verdict."""
        if self.errors:
            return ExitCode.ERROR
        if self.failed:
            return ExitCode.CHECK_FAILED
        if self.not_run:
            return ExitCode.ERROR
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        verdicts = (Status.PASS, Status.WARN, Status.FAIL)
        counts = {status.value: sum(1 for r in self.results if r.status is status) for status in verdicts}
        counts["could_not_run"] = len(self.not_run)
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "preflight",
            "environment": self.environment,
            "region": self.region,
            "environment_region": self.environment_region,
            "exit_code": int(self.exit_code),
            "summary": self.summary(),
            "counts": self.counts(),
            "checks": [r.to_json() for r in self.results],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    def summary(self) -> str:
        if self.errors:
            return f"preflight could not run: {self.errors[0]}"
        counts = self.counts()
        tally = f"{counts['PASS']} PASS, {counts['WARN']} WARN, {counts['FAIL']} FAIL"
        where = f"environment {self.environment} in {self.region}"
        not_run = self.not_run
        if self.failed:
            names = ", ".join(f"{r.check.value} {r.subject}" for r in self.failed)
            also = f"; {len(not_run)} could not run" if not_run else ""
            return f"preflight failed for {where}: {tally} ({names}){also}. Fix them before cdk deploy"
        if not_run:
            first = not_run[0].reason.removeprefix("could not run: ")
            return (
                f"preflight incomplete for {where}: {len(not_run)} of {len(self.results)} check(s) could not run "
                f"({first}); none of the others failed"
            )
        warn = "; read the WARN rows" if counts["WARN"] else ""
        return f"preflight passed for {where}: {tally}{warn}"

    def fixes(self) -> list[str]:
        """One line per distinct fix, naming the row it is for, or how many rows (of which checks) share it."""
        by_fix: dict[str, list[CheckResult]] = {}
        for result in self.results:
            if result.fix:
                by_fix.setdefault(result.fix, []).append(result)
        lines = []
        for fix, results in by_fix.items():
            if len(results) == 1:
                label = f"{results[0].status.value} {results[0].check.value} {results[0].subject}"
            else:
                checks = ", ".join(dict.fromkeys(r.check.value for r in results))
                label = f"{len(results)} rows ({checks})"
            lines.append(f"{label}: {fix}")
        return lines

    def render(self) -> tuple[str, str]:
        """(stdout, stderr): the table, the fixes and the summary; warnings and errors on stderr."""
        out: list[str] = []
        if self.results:
            rows = [[r.check.value, r.subject, r.status.value, r.reason] for r in self.results]
            out.append(table(["CHECK", "SUBJECT", "STATUS", "REASON"], rows))
            fixes = self.fixes()
            if fixes:
                out += ["", "fixes:", *(f"  {line}" for line in fixes)]
            out.append("")
        err = [f"warning: {w}" for w in self.warnings] + [f"error: {e}" for e in self.errors]
        if self.errors:  # nothing ran: the error on stderr is the whole story
            return "", "".join(f"{line}\n" for line in err)
        out.append(self.summary())
        return "\n".join(out) + "\n", "".join(f"{line}\n" for line in err)


def preflight(
    env_name: str,
    *,
    region: str | None = None,
    profile: str | None = None,
    endpoint_urls: Mapping[str, str] | None = None,
    chart_repositories: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> PreflightReport:
    try:
        env = get_environment(env_name)
    except ConfigError as exc:
        report = PreflightReport(env_name, region, None)
        report.errors.append(
            f"unknown environment {env_name!r}; known: {exc.allowed} (declared in infra/spec/environments.py)"
        )
        return report
    chosen = region or env.region
    report = PreflightReport(env.name, chosen, env.region)
    if chosen != env.region:
        report.warnings.append(
            f"--region {chosen} differs from environment {env.name}'s region {env.region}: its zone names "
            f"({', '.join(env.network.availability_zones)}) and cdk deploy use {env.region}"
        )
    aws = Aws(region=chosen, profile=profile, endpoint_urls=endpoint_urls)
    report.results = run_checks(env, aws, chart_repositories=chart_repositories, progress=progress)
    return report


# --- command line ------------------------------------------------------------------------------

_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")


def _region(text: str) -> str:
    if not _REGION.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an AWS region name (e.g. us-east-2)")
    return text


# --endpoint-url [SERVICE=]URL (capacity and scale take it too) and --chart-repository [CHART=]URL.
aws_endpoint = keyed_url(SERVICES, default=ALL_SERVICES, key_name="SERVICE")
_chart_repository = keyed_url(HELM_CHARTS, default=ALL_CHARTS, key_name="CHART")


class StderrProgress:
    """One line on stderr, rewritten per call, and cleared at the end; only on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    def __call__(self, message: str) -> None:
        self.stream.write(f"\r\033[Kpreflight: checking {message} ...")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="before cdk deploy: check with AWS that an environment's GPU types, EFA, quotas, capacity, "
        "Kubernetes version, add-ons, subnet addresses, admin principals and chart versions will work, and "
        "that no leftover of an earlier deployment is in the way",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 no check failed (WARN rows allowed), 1 a check failed, 2 could not run "
        "(unknown environment, bad arguments, or a check could not run and none failed: no credentials, "
        "endpoint unreachable, access denied)",
    )
    parser.add_argument(
        "--env",
        required=True,
        metavar="NAME",
        help=f"the environment: {', '.join(ENVIRONMENTS)} (infra/spec/environments.py)",
    )
    parser.add_argument(
        "--region",
        type=_region,
        help="the region to ask (default: the environment's own; another one is warned about)",
    )
    parser.add_argument("--profile", help="the AWS profile (default: boto3's choice, e.g. AWS_PROFILE)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument(
        "--endpoint-url",
        type=aws_endpoint,
        action="append",
        default=[],
        metavar="[SERVICE=]URL",
        help=f"send requests to another endpoint, e.g. a local emulator; SERVICE is one of {', '.join(SERVICES)} "
        "(default: all of them); repeatable",
    )
    parser.add_argument(
        "--chart-repository",
        type=_chart_repository,
        action="append",
        default=[],
        metavar="[CHART=]URL",
        help=f"fetch a pinned chart's index.yaml from another Helm repository (a mirror); CHART is one of "
        f"{', '.join(HELM_CHARTS)} (default: all of them); repeatable",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    endpoints: dict[str, str] = dict(args.endpoint_url)
    progress = StderrProgress(sys.stderr) if sys.stderr.isatty() else None
    try:
        report = preflight(
            args.env,
            region=args.region,
            profile=args.profile,
            endpoint_urls=endpoints,
            chart_repositories=dict(args.chart_repository),
            progress=progress,
        )
    finally:
        if progress is not None:
            progress.clear()
    if args.json:
        sys.stdout.write(to_json(report.to_json()) + "\n")
        _, err = report.render()
        sys.stderr.write(err)
    else:
        out, err = report.render()
        sys.stdout.write(out)
        sys.stderr.write(err)
    return int(report.exit_code)

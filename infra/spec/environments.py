"""Environments as typed, validated data. The only place sizes, CIDRs and AZs are declared.

Availability-zone names are committed here rather than looked up so that synth is
deterministic and needs no credentials. AZ names map to different physical zones in
each AWS account: set `gpu_availability_zone` to the zone that holds your GPU
capacity (reservation or Capacity Block) in your account.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from types import MappingProxyType

from infra.spec.errors import ConfigError
from infra.spec.images import NvrxImageConfig
from infra.spec.instances import InstanceType, instance_type

# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)

# Names that become Kubernetes object names (a Service name must start with a letter), 1-32 chars.
DNS_LABEL = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
_ACCOUNT = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_ROLE_NAME = re.compile(r"^[\w+=,.@-]{1,64}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_PRINCIPAL_ARN = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """Node-group bounds; min <= desired <= max, as EKS managed node groups require."""

    min_size: int
    desired_size: int
    max_size: int

    def __post_init__(self) -> None:
        if self.min_size < 0:
            raise ConfigError("min_size", self.min_size, ">= 0")
        if self.max_size < 1:
            raise ConfigError("max_size", self.max_size, ">= 1")
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ConfigError(
                "desired_size",
                self.desired_size,
                f"min_size ({self.min_size}) <= desired_size <= max_size ({self.max_size})",
                "order the three sizes as min <= desired <= max",
            )


class EndpointAccess(Enum):
    PRIVATE = "private"
    PUBLIC_AND_PRIVATE = "public-and-private"


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    cidr: str
    availability_zones: tuple[str, ...]
    nat_gateways: int
    # /18 = 16,384 addresses per AZ; infra/spec/addressing.py checks it against the nodes.
    private_subnet_prefix: int = 18
    # Public subnets hold only the NAT gateways.
    public_subnet_prefix: int = 26
    flow_log_retention_days: int = 30

    def __post_init__(self) -> None:
        try:
            net = ipaddress.IPv4Network(self.cidr, strict=True)
        except ValueError as exc:
            raise ConfigError(
                "network.cidr", self.cidr, "an IPv4 network in CIDR form, /16 to /24, e.g. 10.10.0.0/16", str(exc)
            ) from None
        if not 16 <= net.prefixlen <= 24:
            raise ConfigError("network.cidr", self.cidr, "a prefix length from /16 to /24 (the VPC limits)")
        if not net.is_private:
            raise ConfigError("network.cidr", self.cidr, "a private range (10/8, 172.16/12, 192.168/16, 100.64/10)")
        if len(self.availability_zones) < 2:
            raise ConfigError(
                "network.availability_zones",
                self.availability_zones,
                "at least 2 zones (EKS needs control-plane subnets in two AZs)",
            )
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ConfigError("network.availability_zones", self.availability_zones, "distinct zone names")
        if not 1 <= self.nat_gateways <= len(self.availability_zones):
            raise ConfigError(
                "network.nat_gateways",
                self.nat_gateways,
                f"1 to {len(self.availability_zones)} (one per availability zone at most)",
                "use 1 for a cheap environment or one per AZ for zone-independent egress",
            )
        for name, prefix in (
            ("network.private_subnet_prefix", self.private_subnet_prefix),
            ("network.public_subnet_prefix", self.public_subnet_prefix),
        ):
            if not net.prefixlen < prefix <= 28:
                raise ConfigError(name, prefix, f"a prefix longer than the VPC's /{net.prefixlen} and at most /28")
        needed = len(self.availability_zones) * (
            2 ** (32 - self.private_subnet_prefix) + 2 ** (32 - self.public_subnet_prefix)
        )
        if needed > net.num_addresses:
            raise ConfigError(
                "network.private_subnet_prefix",
                self.private_subnet_prefix,
                f"subnets that fit the VPC: {len(self.availability_zones)} AZs x (private + public) need "
                f"{needed} addresses but {self.cidr} has {net.num_addresses}",
                "use a larger VPC CIDR or longer subnet prefixes",
            )
        if self.flow_log_retention_days not in LOG_RETENTION_DAYS:
            raise ConfigError(
                "network.flow_log_retention_days",
                self.flow_log_retention_days,
                ", ".join(map(str, LOG_RETENTION_DAYS)),
            )


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    name: str
    endpoint_access: EndpointAccess = EndpointAccess.PRIVATE
    # Only with PUBLIC_AND_PRIVATE: who may reach the public endpoint.
    public_access_cidrs: tuple[str, ...] = ()
    # IAM role names (in the deploying account) or full role/user ARNs; never a wildcard.
    admin_principals: tuple[str, ...] = ()
    control_plane_log_retention_days: int = 90

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.name):
            raise ConfigError("cluster.name", self.name, "lower-case letters, digits and '-', 1-32 chars")
        if self.endpoint_access is EndpointAccess.PRIVATE and self.public_access_cidrs:
            raise ConfigError(
                "cluster.public_access_cidrs",
                self.public_access_cidrs,
                "empty while endpoint_access is PRIVATE",
                "set endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE to open the public endpoint",
            )
        if self.endpoint_access is EndpointAccess.PUBLIC_AND_PRIVATE and not self.public_access_cidrs:
            raise ConfigError(
                "cluster.public_access_cidrs",
                self.public_access_cidrs,
                "at least one CIDR when the public endpoint is on",
                "list the office or VPN ranges allowed to reach the API server",
            )
        for cidr in self.public_access_cidrs:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ConfigError("cluster.public_access_cidrs", cidr, "CIDR blocks such as 203.0.113.0/24") from None
            if net.prefixlen == 0:
                raise ConfigError(
                    "cluster.public_access_cidrs",
                    cidr,
                    "specific ranges; an open API endpoint is refused",
                    "list the office or VPN ranges instead",
                )
        if not self.admin_principals:
            raise ConfigError(
                "cluster.admin_principals", self.admin_principals, "at least one IAM role name or role/user ARN"
            )
        for principal in self.admin_principals:
            if "*" in principal or not (_ROLE_NAME.match(principal) or _PRINCIPAL_ARN.match(principal)):
                raise ConfigError(
                    "cluster.admin_principals",
                    principal,
                    "an IAM role name (e.g. PlatformAdmin) or arn:aws:iam::<account>:role/<name>; no wildcards",
                )
        if self.control_plane_log_retention_days not in LOG_RETENTION_DAYS:
            raise ConfigError(
                "cluster.control_plane_log_retention_days",
                self.control_plane_log_retention_days,
                ", ".join(map(str, LOG_RETENTION_DAYS)),
            )


@dataclass(frozen=True, kw_only=True)
class SystemNodeGroupConfig:
    """The m7i nodes that run the KubeRay operator, the Ray head and cluster add-ons."""

    scaling: Scaling
    instance_type: str = "m7i.xlarge"
    disk_size_gib: int = 100

    def __post_init__(self) -> None:
        spec = instance_type(self.instance_type, field="system_nodes.instance_type")
        if spec.gpu is not None:
            raise ConfigError(
                "system_nodes.instance_type",
                self.instance_type,
                "a type without GPUs (the system group runs operators and the Ray head)",
            )
        if not 20 <= self.disk_size_gib <= 16384:
            raise ConfigError("system_nodes.disk_size_gib", self.disk_size_gib, "20 to 16384 GiB")

    @property
    def instance(self) -> InstanceType:
        return instance_type(self.instance_type)


class CapacityKind(Enum):
    ON_DEMAND = "on-demand"
    # An On-Demand Capacity Reservation (ODCR) the group launches into.
    RESERVATION = "capacity-reservation"
    # An EC2 Capacity Block for ML: market type capacity-block, node group capacity type CAPACITY_BLOCK.
    CAPACITY_BLOCK = "capacity-block"


_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8,17}$")
# How long before a Capacity Block's end every job on it has checkpointed and stopped. EC2 User Guide, "Monitor
# Capacity Blocks using EventBridge": forty minutes before the block ends EC2 sends the expiration warning, and the
# instances in it "will begin to terminate in 10 minutes" (30 minutes before the end). Stopping at the warning leaves
# the final checkpoint's write those 10 minutes before the first instance goes; a job loses at most this margin.
CAPACITY_BLOCK_STOP_MARGIN = timedelta(minutes=40)
# When the first instances of a block begin to terminate (the same page): the stop's checkpoint must be written and
# read back between the stop point and this (k8s/checkpoint_writes.py).
CAPACITY_BLOCK_TERMINATION_LEAD = timedelta(minutes=30)
# EC2 placement group names: up to 255 ASCII characters (CreatePlacementGroup, GroupName).
_PLACEMENT_GROUP_NAME = re.compile(r"^[\x21-\x7e]{1,255}$")


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """Where a GPU group's instances come from.

    `placement_group_name` is for RESERVATION / CAPACITY_BLOCK groups whose reservation was created
    in a cluster placement group: an On-Demand Capacity Reservation made in a cluster placement group
    is used only by instances launched into that same group (EC2 user guide, "Capacity Reservations
    in cluster placement groups"), so the launch template then sets
    `Placement.GroupName` to it. Plain ON_DEMAND groups get a cluster placement group of their own
    and refuse the field.

    `end` is a CAPACITY_BLOCK's end, ISO 8601 with its UTC offset, as DescribeCapacityReservations gives it
    (EndDate): jobs on the group checkpoint and stop CAPACITY_BLOCK_STOP_MARGIN before it (training/deadline.py).
    `trainctl preflight` fails when it differs from the block's EndDate (an extended block moves it).
    """

    kind: CapacityKind = CapacityKind.ON_DEMAND
    reservation_id: str | None = None
    placement_group_name: str | None = None
    end: str | None = None

    def __post_init__(self) -> None:
        self._check_end()
        if self.kind is CapacityKind.ON_DEMAND:
            if self.reservation_id is not None:
                raise ConfigError(
                    "capacity.reservation_id",
                    self.reservation_id,
                    "none for plain on-demand capacity",
                    "set kind=CapacityKind.RESERVATION or CapacityKind.CAPACITY_BLOCK to target it",
                )
            if self.placement_group_name is not None:
                raise ConfigError(
                    "capacity.placement_group_name",
                    self.placement_group_name,
                    "none for plain on-demand capacity (the group gets a cluster placement group of its own)",
                    "name a placement group only for a reservation or Capacity Block created in one",
                )
            return
        if self.reservation_id is None or not _RESERVATION_ID.match(self.reservation_id):
            raise ConfigError(
                "capacity.reservation_id",
                self.reservation_id,
                "the reservation's id, cr- followed by 8-17 hex digits",
                f"a {self.kind.value} group launches only into a named reservation",
            )
        if self.placement_group_name is not None and not _PLACEMENT_GROUP_NAME.match(self.placement_group_name):
            raise ConfigError(
                "capacity.placement_group_name",
                self.placement_group_name,
                "the placement group's name, 1-255 printable ASCII characters without spaces",
                "copy it from the reservation (describe-capacity-reservations, PlacementGroupArn)",
            )

    def _check_end(self) -> None:
        if self.end is None:
            return
        if self.kind is not CapacityKind.CAPACITY_BLOCK:
            raise ConfigError(
                "capacity.end",
                self.end,
                "none for a group that is not on a Capacity Block (only a block ends)",
                "remove capacity.end, or set kind=CapacityKind.CAPACITY_BLOCK",
            )
        if self.end_time is None:
            raise ConfigError(
                "capacity.end",
                self.end,
                "an ISO 8601 time with its UTC offset, e.g. 2026-12-10T11:30:00+00:00",
                "copy the block's EndDate (aws ec2 describe-capacity-reservations)",
            )

    @property
    def end_time(self) -> datetime | None:
        """`end` as an aware datetime; None when unset or not an ISO time with an offset."""
        if self.end is None:
            return None
        try:
            end = datetime.fromisoformat(self.end)
        except ValueError:
            return None
        return end if end.utcoffset() is not None else None

    @property
    def brings_own_placement(self) -> bool:
        """Reservations and Capacity Blocks are placed when AWS provisions them; a forced
        cluster placement group of our own can make launches fail against them."""
        return self.kind is not CapacityKind.ON_DEMAND


# A spare for every gated gang. Every multi-node GPU workload starts with the fabric gate (training/fabric_gate.py),
# which taints a node whose NCCL fell back from EFA (NoSchedule); the workload is then re-placed, and a whole-node
# gang lands only on untainted nodes, so a group needs one node beside the gang or the re-placed gang stays Pending
# until someone repairs the node. The one home of that rule: the spec refuses a group that cannot hold it
# (GpuNodeGroupConfig), `trainctl scale` and `trainctl capacity` size to it and warn below it (trainctl/gate_taints.py).
GATE_SPARE_NODES = 1


def gang_is_gated(gang: int) -> bool:
    """Whether a gang of `gang` nodes runs the fabric gate: it proves the fabric between nodes, so 2 or more."""
    return gang >= 2


def nodes_with_spare(gang: int) -> int:
    """The nodes a group needs for a gang of `gang` nodes: the gang, plus GATE_SPARE_NODES when it is gated."""
    return gang + GATE_SPARE_NODES if gang_is_gated(gang) else gang


@dataclass(frozen=True, kw_only=True)
class GpuNodeGroupConfig:
    """A GPU node group with EFA. The construct that builds it reads only this and the instance facts.

    Capacity policy (issue 13): a managed node group finishes creating only once its instances
    launch, so a GPU shortage (InsufficientInstanceCapacity) fails the node group and rolls back its
    stack. Hence:

    - ON_DEMAND without a reservation: `scaling.desired_size` must be 0 unless `launch_at_deploy=True`
      (an explicit opt-in that accepts a capacity shortage rolling back this group's GPU stack). Scale
      up after deploy with `trainctl scale` (or `aws eks update-nodegroup-config --scaling-config
      desiredSize=N`).
    - CAPACITY_BLOCK: desired 0 always. EKS user guide, "Create a managed node group with Capacity
      Blocks for ML" (capacity-blocks-mng): "When upgrading managed node groups with Capacity Blocks,
      make sure that the desired size of the node group is set to 0", and a block's instances can only
      launch while the block is active. Nodes are launched by setting the desired size once the block
      is active (`trainctl scale` / update-nodegroup-config, or a scheduled scaling action on the
      node group's Auto Scaling group at the block's start time), and scaled back to 0 before it ends
      (the EKS guide suggests more than 30 minutes before the end time, to drain).
    - RESERVATION (ODCR): the instances exist already, desired > 0 is allowed.

    `workload_nodes` is how many nodes one training job on this group uses (Ray worker replicas,
    NVRx pods); workloads read it instead of `scaling.desired_size`, which is 0 at deploy. With 2 or more
    the job is gated (the fabric gate), and `scaling.max_size` must hold `nodes_with_spare`, the gang plus a
    spare node to re-place it onto when the gate takes one out (GATE_SPARE_NODES).
    """

    name: str
    instance_type: str
    scaling: Scaling
    # EFA interfaces to attach; None attaches the most the instance type allows.
    efa_interfaces: int | None = None
    # Training images (CUDA, PyTorch, NCCL) are 10-20 GB each; several versions get cached.
    root_volume_gib: int = 500
    capacity: Capacity = field(default_factory=Capacity)
    # Opt-in for an On-Demand group to launch instances during `cdk deploy` (desired_size > 0).
    launch_at_deploy: bool = False
    # Nodes one training job on this group uses (Ray worker replicas, NVRx pods).
    workload_nodes: int = 2

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.name):
            raise ConfigError("gpu_node_groups.name", self.name, "lower-case letters, digits and '-', 1-32 chars")
        where = f"gpu_node_groups[{self.name}]"
        spec = instance_type(self.instance_type, field=f"{where}.instance_type")
        if spec.gpu is None or spec.efa is None:
            raise ConfigError(
                f"{where}.instance_type",
                self.instance_type,
                _gpu_efa_types(),
                "GPU groups need an instance type with GPUs and EFA",
            )
        if self.efa_interfaces is not None and not 1 <= self.efa_interfaces <= spec.efa.max_interfaces:
            raise ConfigError(
                f"{where}.efa_interfaces",
                self.efa_interfaces,
                f"1 to {spec.efa.max_interfaces} (the most {self.instance_type} supports)",
                "leave it unset to attach every EFA interface the type has",
            )
        if not 200 <= self.root_volume_gib <= 16384:
            raise ConfigError(
                f"{where}.root_volume_gib",
                self.root_volume_gib,
                "200 to 16384 GiB (training images need room)",
            )
        if not 1 <= self.workload_nodes <= self.scaling.max_size:
            raise ConfigError(
                f"{where}.workload_nodes",
                self.workload_nodes,
                f"1 to scaling.max_size ({self.scaling.max_size})",
                "a job cannot use more nodes than the group can hold; raise max_size or use fewer nodes",
            )
        if self.scaling.max_size < self.nodes_with_spare:
            raise ConfigError(
                f"{where}.scaling.max_size",
                self.scaling.max_size,
                f"at least workload_nodes + {GATE_SPARE_NODES} ({self.nodes_with_spare}): the group's "
                f"{self.workload_nodes}-node jobs run the fabric gate, which takes a failing node out (a taint), "
                "and the job is re-placed only onto a spare untainted node",
                f"raise scaling.max_size to {self.nodes_with_spare} (and scale to it with `trainctl scale`), "
                "or use fewer workload_nodes",
            )
        self._check_capacity_policy(where)

    @property
    def gated(self) -> bool:
        """Whether this group's jobs run the fabric gate (multi-node: workload_nodes of 2 or more)."""
        return gang_is_gated(self.workload_nodes)

    @property
    def nodes_with_spare(self) -> int:
        """The nodes this group's jobs need: workload_nodes, plus the spare a gated gang is re-placed onto."""
        return nodes_with_spare(self.workload_nodes)

    def _check_capacity_policy(self, where: str) -> None:
        desired = self.scaling.desired_size
        kind = self.capacity.kind
        if kind is CapacityKind.CAPACITY_BLOCK:
            if self.launch_at_deploy:
                raise ConfigError(
                    f"{where}.launch_at_deploy",
                    self.launch_at_deploy,
                    "False for a Capacity Block group (EKS requires desired size 0 when it is updated)",
                    "scale up with `trainctl scale` once the block is active",
                )
            if desired != 0:
                raise ConfigError(
                    f"{where}.scaling.desired_size",
                    desired,
                    "0 for a Capacity Block group (EKS requires desired size 0 when a Capacity Block "
                    "node group is updated, and the block launches instances only while active)",
                    "set desired_size=0 and scale up with `trainctl scale` once the block is active",
                )
        elif kind is CapacityKind.ON_DEMAND and desired > 0 and not self.launch_at_deploy:
            raise ConfigError(
                f"{where}.scaling.desired_size",
                desired,
                "0 for an On-Demand group without a reservation (a capacity shortage at deploy fails the "
                "node group and rolls back its stack)",
                "scale up after deploy with `trainctl scale` or set launch_at_deploy=True and accept that "
                "a capacity shortage rolls back that GPU stack",
            )

    @property
    def instance(self) -> InstanceType:
        return instance_type(self.instance_type)

    @property
    def efa_interface_count(self) -> int:
        efa = self.instance.efa
        assert efa is not None  # checked on construction
        return self.efa_interfaces if self.efa_interfaces is not None else efa.max_interfaces


def _gpu_efa_types() -> list[str]:
    from infra.spec.instances import INSTANCE_TYPES

    return sorted(n for n, s in INSTANCE_TYPES.items() if s.gpu is not None and s.efa is not None)


class LustreDeployment(Enum):
    # Persistent, replicated within the AZ: checkpoints survive a file-server failure.
    PERSISTENT_2 = "PERSISTENT_2"
    # Cheaper, no replication: for dev, where a lost checkpoint costs minutes.
    SCRATCH_2 = "SCRATCH_2"


# FSx for Lustre API rules (FSx Lustre user guide, "Storage capacity"): 1200 GiB, 2400 GiB,
# then steps of 2400 GiB; PERSISTENT_2 throughput per TiB is one of these.
PERSISTENT_2_THROUGHPUT = (125, 250, 500, 1000)


def lustre_size_at_least(gib: float) -> int:
    """The smallest FSx for Lustre size (the rule above) of at least `gib`."""
    if gib <= 1200:
        return 1200
    return 2400 * max(1, math.ceil(gib / 2400))


@dataclass(frozen=True, kw_only=True)
class CheckpointStorageConfig:
    """An FSx for Lustre file system in the GPU zone, mounted by jobs through a claim of the same name in each
    workload namespace (`training` for the NVRx job, `ray` for Ray Train's storage_path): two static
    PersistentVolumes of the one file system, since a claim binds one volume and lives in one namespace."""

    deployment: LustreDeployment = LustreDeployment.PERSISTENT_2
    storage_capacity_gib: int = 2400
    # MB/s per TiB; PERSISTENT_2 only.
    throughput_per_tib: int | None = 250
    claim_name: str = "checkpoints"

    def __post_init__(self) -> None:
        gib = self.storage_capacity_gib
        if not (gib in (1200, 2400) or (gib > 2400 and gib % 2400 == 0)):
            raise ConfigError(
                "add_ons.checkpoint_storage.storage_capacity_gib",
                gib,
                "1200, 2400 or a multiple of 2400 GiB (the FSx for Lustre sizes)",
            )
        if self.deployment is LustreDeployment.PERSISTENT_2:
            if self.throughput_per_tib not in PERSISTENT_2_THROUGHPUT:
                raise ConfigError(
                    "add_ons.checkpoint_storage.throughput_per_tib",
                    self.throughput_per_tib,
                    ", ".join(map(str, PERSISTENT_2_THROUGHPUT)) + " MB/s/TiB for PERSISTENT_2",
                )
        elif self.throughput_per_tib is not None:
            raise ConfigError(
                "add_ons.checkpoint_storage.throughput_per_tib",
                self.throughput_per_tib,
                "None for SCRATCH_2 (its throughput is fixed)",
            )
        if not DNS_LABEL.match(self.claim_name):
            raise ConfigError("add_ons.checkpoint_storage.claim_name", self.claim_name, "a DNS label")


@dataclass(frozen=True, kw_only=True)
class AddOnsConfig:
    """Which cluster add-ons an environment gets; versions live in infra/spec/versions.py."""

    nvidia_device_plugin: bool = True
    efa_device_plugin: bool = True
    kuberay_operator: bool = True
    # Admission for the GPU workloads (infra/addons/kueue.py): one queue per GPU group, all-or-nothing.
    kueue: bool = True
    node_monitoring_agent: bool = True
    checkpoint_storage: CheckpointStorageConfig | None = None
    # Container Insights (GPU/EFA metrics), the SNS alarm topic, per-group alarms and the dashboard.
    observability: bool = True
    # Subscribed to the alarm topic (SNS sends a confirmation mail first); None: no subscription.
    alarm_email: str | None = None
    # The NVRx job's image: the one built from images/nvrx/Dockerfile, or (where allowed) NVRx installed at pod start.
    nvrx_image: NvrxImageConfig = field(default_factory=NvrxImageConfig)

    def __post_init__(self) -> None:
        if self.alarm_email is not None and not _EMAIL.match(self.alarm_email):
            raise ConfigError(
                "add_ons.alarm_email", self.alarm_email, "an e-mail address such as ml-oncall@example.com"
            )
        if self.alarm_email is not None and not self.observability:
            raise ConfigError(
                "add_ons.alarm_email", self.alarm_email, "None while add_ons.observability is off (no alarms to send)"
            )


_LOGICAL_ID = re.compile(r"^[A-Za-z0-9]{1,255}$")
_STACK_ID = re.compile(r"^(Platform|Storage|Gpu-[a-z0-9-]{1,32})$")


@dataclass(frozen=True, kw_only=True)
class AcknowledgedReplacement:
    """A stateful replacement `trainctl plan --env E` may let through: the resource (stack id and logical id,
    as the plan names them) and why replacing it is acceptable. Remove it once the change is deployed."""

    stack: str
    logical_id: str
    reason: str

    def __post_init__(self) -> None:
        if not _STACK_ID.match(self.stack):
            raise ConfigError(
                "acknowledged_replacements.stack", self.stack, "Platform, Storage or Gpu-<group> (the stack id)"
            )
        if not _LOGICAL_ID.match(self.logical_id):
            raise ConfigError(
                "acknowledged_replacements.logical_id",
                self.logical_id,
                "a CloudFormation logical id (letters and digits), as `trainctl plan` prints it",
            )
        if len(self.reason.strip()) < 10:
            raise ConfigError(
                "acknowledged_replacements.reason",
                self.reason,
                "a sentence saying why the replacement is acceptable (at least 10 characters)",
                "say what happens to the data, e.g. 'zone move; checkpoints restored from backup-...'",
            )


@dataclass(frozen=True, kw_only=True)
class Environment:
    name: str
    region: str
    network: NetworkConfig
    cluster: ClusterConfig
    system_nodes: SystemNodeGroupConfig
    # EFA traffic cannot cross AZs: every GPU group of the environment lives in this one zone.
    gpu_availability_zone: str
    gpu_node_groups: tuple[GpuNodeGroupConfig, ...] = ()
    add_ons: AddOnsConfig = field(default_factory=AddOnsConfig)
    # Filled by app.py from context or CDK_DEFAULT_ACCOUNT; None keeps the stack account-agnostic.
    account: str | None = None
    tags: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Stateful replacements `trainctl plan` lets through, each with its reason (a zone move, a capacity switch).
    acknowledged_replacements: tuple[AcknowledgedReplacement, ...] = ()

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.name):
            raise ConfigError("environment.name", self.name, "lower-case letters, digits and '-'")
        if not _REGION.match(self.region):
            raise ConfigError("region", self.region, "an AWS region name such as us-west-2")
        if self.account is not None and not _ACCOUNT.match(self.account):
            raise ConfigError("account", self.account, "a 12-digit AWS account id")
        for az in self.network.availability_zones:
            if not (az.startswith(self.region) and len(az) == len(self.region) + 1):
                raise ConfigError(
                    "network.availability_zones",
                    az,
                    f"zones of region {self.region} ({self.region}a, {self.region}b, ...)",
                )
        if self.gpu_availability_zone not in self.network.availability_zones:
            raise ConfigError(
                "gpu_availability_zone",
                self.gpu_availability_zone,
                self.network.availability_zones,
                "pick one of the VPC's zones (the one holding your GPU capacity)",
            )
        names = [g.name for g in self.gpu_node_groups]
        if len(set(names)) != len(names):
            raise ConfigError("gpu_node_groups.name", names, "distinct group names")
        self._check_add_on_prerequisites()
        self._check_nodegroup_names()
        # Imported here: addressing reads Environment, so it cannot be imported at module top.
        from infra.spec.addressing import check_address_budget

        check_address_budget(self)

    def _check_nodegroup_names(self) -> None:
        from infra.spec.replacement_names import NODEGROUP_NAME_MAX, gpu_nodegroup_name

        for group in self.gpu_node_groups:
            name = gpu_nodegroup_name(self, group)
            if len(name) > NODEGROUP_NAME_MAX:
                raise ConfigError(
                    f"gpu_node_groups[{group.name}].name",
                    name,
                    f"a node group name of at most {NODEGROUP_NAME_MAX} characters (EKS CreateNodegroup)",
                    "shorten the cluster or group name",
                )

    def _check_add_on_prerequisites(self) -> None:
        if self.gpu_node_groups:
            return
        needs_gpu_groups = {
            "add_ons.checkpoint_storage": (
                self.add_ons.checkpoint_storage is not None,
                "the file system is placed in the GPU node groups' zone",
            ),
            "add_ons.nvidia_device_plugin": (self.add_ons.nvidia_device_plugin, "it runs only on GPU nodes"),
            "add_ons.efa_device_plugin": (self.add_ons.efa_device_plugin, "it runs only on EFA GPU nodes"),
        }
        for name, (enabled, why) in needs_gpu_groups.items():
            if enabled:
                raise ConfigError(
                    name,
                    "enabled",
                    f"disabled while the environment has no GPU node group ({why})",
                    "add a GPU node group or disable the add-on",
                )


def _dev() -> Environment:
    return Environment(
        name="dev",
        region="us-west-2",
        network=NetworkConfig(
            cidr="10.10.0.0/16",
            availability_zones=("us-west-2a", "us-west-2b"),
            nat_gateways=1,
            flow_log_retention_days=30,
        ),
        cluster=ClusterConfig(
            name="ml-dev",
            admin_principals=("PlatformAdmin",),
            control_plane_log_retention_days=30,
        ),
        system_nodes=SystemNodeGroupConfig(scaling=Scaling(min_size=2, desired_size=2, max_size=3)),
        gpu_availability_zone="us-west-2a",
        # The Ray Train fine-tune scale: 2 x g6.12xlarge = 8 L4 GPUs. Desired 0: scaled up after deploy. Max 3: the
        # gang of 2 plus the spare it is re-placed onto when the fabric gate takes a node out (GATE_SPARE_NODES).
        gpu_node_groups=(
            GpuNodeGroupConfig(
                name="g6",
                instance_type="g6.12xlarge",
                scaling=Scaling(min_size=0, desired_size=0, max_size=3),
                workload_nodes=2,
            ),
        ),
        # Multi-node jobs need checkpoints on storage every pod sees (issue 17): the smallest, unreplicated FSx for
        # Lustre. SCRATCH_2 is $0.140 per GB-month in us-west-2 and us-east-1 (aws.amazon.com/fsx/lustre/pricing,
        # scratch SSD; prorated by the second): 1,200 GB is about $168 a month.
        add_ons=AddOnsConfig(
            checkpoint_storage=CheckpointStorageConfig(
                deployment=LustreDeployment.SCRATCH_2, storage_capacity_gib=1200, throughput_per_tib=None
            ),
            # A first try may install NVRx at pod start (an explicit opt-in, NvrxFsdpJob.start_install).
            nvrx_image=NvrxImageConfig(allow_start_install=True),
        ),
    )


def _prod() -> Environment:
    return Environment(
        name="prod",
        region="us-east-2",
        network=NetworkConfig(
            cidr="10.20.0.0/16",
            availability_zones=("us-east-2a", "us-east-2b", "us-east-2c"),
            nat_gateways=3,
            flow_log_retention_days=365,
        ),
        cluster=ClusterConfig(
            name="ml-prod",
            admin_principals=("PlatformAdmin",),
            control_plane_log_retention_days=365,
        ),
        system_nodes=SystemNodeGroupConfig(scaling=Scaling(min_size=2, desired_size=3, max_size=4)),
        gpu_availability_zone="us-east-2a",
        # Desired 0: On-Demand GPU capacity is scaled up after deploy (`trainctl scale`).
        gpu_node_groups=(
            GpuNodeGroupConfig(
                name="p5",
                instance_type="p5.48xlarge",
                scaling=Scaling(min_size=0, desired_size=0, max_size=8),
                workload_nodes=2,
            ),
            GpuNodeGroupConfig(
                name="g6",
                instance_type="g6.12xlarge",
                scaling=Scaling(min_size=0, desired_size=0, max_size=4),
                workload_nodes=2,
            ),
        ),
        add_ons=AddOnsConfig(
            checkpoint_storage=CheckpointStorageConfig(
                deployment=LustreDeployment.PERSISTENT_2, storage_capacity_gib=4800, throughput_per_tib=250
            )
        ),
    )


ENVIRONMENTS: MappingProxyType[str, Environment] = MappingProxyType({e.name: e for e in (_dev(), _prod())})


def get_environment(name: str) -> Environment:
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise ConfigError(
            "env",
            name,
            ENVIRONMENTS,
            "pass -c env=<name> with a listed name, or declare it in infra/spec/environments.py",
        ) from None

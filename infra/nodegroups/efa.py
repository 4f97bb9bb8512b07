"""GPU managed node groups with EFA, laid out from the instance facts alone.

Creates per group: an EFA security group (all traffic to and from itself), a launch
template (EFA interfaces, IMDSv2 with hop limit 1, gp3 root, NVMe RAID0, placement, capacity), a
cluster placement group unless the capacity brings its own placement, and the managed node group
in exactly one private subnet, its node role without the VPC CNI's policy (infra/nodegroups/node_role.py).
"""

from __future__ import annotations

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.nodegroups.launch_template import IMDS_HOP_LIMIT
from infra.nodegroups.node_role import keep_node_role_to_the_node
from infra.spec import CapacityKind, ConfigError, GpuNodeGroupConfig
from infra.spec.efa import InterfaceSlot, efa_layout
from infra.spec.scheduling import GPU_TAINT_KEY, GPU_TAINT_VALUE, gpu_node_labels

GPU_TAINT = eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE)

# nodeadm NodeConfig: assemble the instance-store NVMe disks as one RAID0 array and put
# the kubelet and containerd state on it (image layers and /dev/shm-heavy pods).
NVME_RAID0_NODECONFIG = """---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0
"""
MIME_BOUNDARY = "==NODEADM=="


def gpu_labels(config: GpuNodeGroupConfig) -> dict[str, str]:
    return gpu_node_labels(config.name, config.instance_type)


def nodeadm_user_data(nodeconfig: str) -> str:
    """MIME multipart user data; EKS merges this part with its own bootstrap part."""
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\n\n'
        f"--{MIME_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n\n"
        f"{nodeconfig}\n"
        f"--{MIME_BOUNDARY}--\n"
    )


class EfaNodeGroup(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        cluster_security_group_id: str,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        config: GpuNodeGroupConfig,
        nodegroup_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        spec = config.instance

        selected = vpc.select_subnets(
            subnet_type=subnets.subnet_type,
            availability_zones=subnets.availability_zones,
            subnet_group_name=subnets.subnet_group_name,
        )
        if len(selected.subnets) != 1:
            raise ConfigError(
                f"gpu_node_groups[{config.name}].subnets",
                [s.availability_zone for s in selected.subnets],
                "exactly one private subnet (EFA traffic does not cross availability zones)",
                "select the subnet of the environment's gpu_availability_zone only",
            )
        self.subnet = selected.subnets[0]

        # EFA requires a security group that admits all traffic from itself and sends all
        # traffic to itself (EC2 and EKS EFA docs); egress elsewhere comes from the cluster SG.
        self.security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=vpc,
            description=f"EFA: all traffic within GPU group {config.name}",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "EFA from itself")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "EFA to itself")

        self.interfaces = efa_layout(spec, config.efa_interface_count)
        groups = [self.security_group.security_group_id, cluster_security_group_id]

        self.placement_group: ec2.CfnPlacementGroup | None = None
        if not config.capacity.brings_own_placement:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")

        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                # The instance type lives here, not in the node group: aws_eks_v2 2.275.0
                # does not know p5 is a GPU type and refuses AL2023_x86_64_NVIDIA with it
                # in instance_types (tests/infra/test_efa_nodegroups.py pins both halves).
                instance_type=config.instance_type,
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled",
                    http_tokens="required",
                    http_put_response_hop_limit=IMDS_HOP_LIMIT,
                ),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name="/dev/xvda",
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=config.root_volume_gib,
                            volume_type="gp3",
                            encrypted=True,
                            delete_on_termination=True,
                        ),
                    )
                ],
                # With explicit interfaces, security groups go on each interface (a
                # top-level SecurityGroupIds is refused), and no SubnetId: EKS sets it.
                network_interfaces=[_interface(slot, groups) for slot in self.interfaces],
                placement=_placement(config, self.placement_group),
                capacity_reservation_specification=_capacity_reservation(config),
                instance_market_options=(
                    ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")
                    if config.capacity.kind is CapacityKind.CAPACITY_BLOCK
                    else None
                ),
                user_data=Fn.base64(nodeadm_user_data(NVME_RAID0_NODECONFIG)) if spec.nvme else None,
            ),
        )

        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            nodegroup_name=nodegroup_name,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=(
                eks.CapacityType.CAPACITY_BLOCK
                if config.capacity.kind is CapacityKind.CAPACITY_BLOCK
                else eks.CapacityType.ON_DEMAND
            ),
            min_size=config.scaling.min_size,
            desired_size=config.scaling.desired_size,
            max_size=config.scaling.max_size,
            max_unavailable=1,
            labels=gpu_labels(config),
            taints=[GPU_TAINT],
            enable_node_auto_repair=True,
            subnets=ec2.SubnetSelection(subnets=[self.subnet]),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
        )
        self.node_role = keep_node_role_to_the_node(self.nodegroup)


def _interface(slot: InterfaceSlot, groups: list[str]) -> ec2.CfnLaunchTemplate.NetworkInterfaceProperty:
    return ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
        network_card_index=slot.network_card_index,
        device_index=slot.device_index,
        interface_type=slot.interface_type,
        groups=groups,
        delete_on_termination=True,
    )


def _placement(
    config: GpuNodeGroupConfig, own: ec2.CfnPlacementGroup | None
) -> ec2.CfnLaunchTemplate.PlacementProperty | None:
    """Our own cluster placement group (plain On-Demand), the reservation's (an ODCR created in a
    cluster placement group is used only by instances launched into that group), or none."""
    if own is not None:
        return ec2.CfnLaunchTemplate.PlacementProperty(group_name=own.ref)
    if config.capacity.placement_group_name is not None:
        return ec2.CfnLaunchTemplate.PlacementProperty(group_name=config.capacity.placement_group_name)
    return None


def _capacity_reservation(
    config: GpuNodeGroupConfig,
) -> ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty | None:
    if config.capacity.reservation_id is None:
        return None
    return ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
        capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
            capacity_reservation_id=config.capacity.reservation_id
        )
    )

"""The m7i system node group: KubeRay operator, Ray head and cluster add-ons run here."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.nodegroups.launch_template import imdsv2_metadata, root_volume
from infra.nodegroups.node_role import keep_node_role_to_the_node
from infra.spec import SystemNodeGroupConfig
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR

SYSTEM_LABELS = dict(SYSTEM_NODE_SELECTOR)


class SystemNodeGroup(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        config: SystemNodeGroupConfig,
        subnets: ec2.SubnetSelection,
        nodegroup_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            block_devices=[root_volume(config.disk_size_gib)],
            **imdsv2_metadata(),  # type: ignore[arg-type]
        )
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            nodegroup_name=nodegroup_name,
            instance_types=[ec2.InstanceType(config.instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            capacity_type=eks.CapacityType.ON_DEMAND,
            min_size=config.scaling.min_size,
            desired_size=config.scaling.desired_size,
            max_size=config.scaling.max_size,
            max_unavailable=1,
            labels=dict(SYSTEM_LABELS),
            enable_node_auto_repair=True,
            subnets=subnets,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.launch_template_id or "",
                version=self.launch_template.latest_version_number,
            ),
        )
        self.node_role = keep_node_role_to_the_node(self.nodegroup)

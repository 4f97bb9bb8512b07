"""One Stage per environment; the stack only wires the constructs together."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack, Stage, Tags
from aws_cdk import Environment as CdkEnvironment
from constructs import Construct

from infra.addons.stack import ClusterAddOns
from infra.cluster import EksCluster
from infra.network import Network
from infra.nodegroups.efa import EfaNodeGroup
from infra.nodegroups.system import SystemNodeGroup
from infra.spec import Environment


class PlatformStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment, **kwargs: object) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.network = Network(self, "Network", config=environment.network)
        self.cluster = EksCluster(
            self,
            "Eks",
            config=environment.cluster,
            vpc=self.network.vpc,
            subnets=self.network.private_subnets,
        )
        self.system_nodes = SystemNodeGroup(
            self,
            "SystemNodes",
            cluster=self.cluster.icluster,
            config=environment.system_nodes,
            subnets=self.network.private_subnets,
            nodegroup_name=f"{environment.cluster.name}-system",
        )
        self.cluster.order_before(self.system_nodes.nodegroup)
        self.cluster.order_coredns_after(self.system_nodes.nodegroup)

        self.gpu_nodes = {
            group.name: EfaNodeGroup(
                self,
                f"GpuNodes-{group.name}",
                cluster=self.cluster.icluster,
                cluster_security_group_id=self.cluster.cluster.cluster_security_group_id,
                vpc=self.network.vpc,
                subnets=self.network.private_subnet_in(environment.gpu_availability_zone),
                config=group,
                nodegroup_name=f"{environment.cluster.name}-{group.name}",
            )
            for group in environment.gpu_node_groups
        }
        for gpu in self.gpu_nodes.values():
            self.cluster.order_before(gpu.nodegroup)

        self.add_ons = ClusterAddOns(
            self,
            "AddOns",
            environment=environment,
            cluster=self.cluster,
            network=self.network,
            system_nodes=self.system_nodes.nodegroup,
            gpu_nodegroups=[gpu.nodegroup for gpu in self.gpu_nodes.values()],
        )

        CfnOutput(self, "ClusterName", value=self.cluster.cluster.cluster_name)
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=f"aws eks update-kubeconfig --name {environment.cluster.name} --region {environment.region}",
            description="The endpoint is private: run it from inside the VPC (VPN, SSM, a bastion).",
        )


class PlatformStage(Stage):
    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment) -> None:
        super().__init__(
            scope,
            construct_id,
            env=CdkEnvironment(account=environment.account, region=environment.region),
        )
        self.environment = environment
        self.stack = PlatformStack(
            self,
            "Platform",
            environment=environment,
            stack_name=f"{environment.cluster.name}-platform",
            description=f"EKS ML training platform, environment {environment.name}",
        )
        Tags.of(self.stack).add("platform:environment", environment.name)
        for key, value in environment.tags.items():
            Tags.of(self.stack).add(key, value)

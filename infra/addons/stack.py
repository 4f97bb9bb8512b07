"""Wires the enabled add-ons of an environment in their declared order."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.addons.efa_device_plugin import EfaDevicePlugin, EfaDevicePluginProps
from infra.addons.fsx_checkpoints import FsxCheckpointStorage
from infra.addons.kuberay_operator import KubeRayOperator, KubeRayOperatorProps
from infra.addons.namespaces import PlatformNamespaces
from infra.addons.node_monitoring import NodeMonitoringAgent
from infra.addons.nvidia_device_plugin import NvidiaDevicePlugin, NvidiaDevicePluginProps
from infra.cluster import EksCluster
from infra.network import Network
from infra.spec import Environment
from infra.spec.namespaces import KUBERAY, TRAINING_NAMESPACES


class ClusterAddOns(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        cluster: EksCluster,
        network: Network,
        system_nodes: eks.Nodegroup,
        gpu_nodegroups: Sequence[eks.Nodegroup],
    ) -> None:
        super().__init__(scope, construct_id)
        config = environment.add_ons
        icluster = cluster.icluster
        # Manifests go through the kubectl Lambda, which needs a node-less but ready API.
        namespaces = (*TRAINING_NAMESPACES, KUBERAY) if config.kuberay_operator else TRAINING_NAMESPACES
        self.namespaces = PlatformNamespaces(
            self, "Namespaces", cluster=icluster, environment=environment.name, namespaces=namespaces
        )

        self.nvidia = (
            NvidiaDevicePlugin(
                self,
                "NvidiaDevicePlugin",
                cluster=icluster,
                props=NvidiaDevicePluginProps(),
                gpu_nodegroups=gpu_nodegroups,
            )
            if config.nvidia_device_plugin
            else None
        )
        self.efa = (
            EfaDevicePlugin(
                self, "EfaDevicePlugin", cluster=icluster, props=EfaDevicePluginProps(), gpu_nodegroups=gpu_nodegroups
            )
            if config.efa_device_plugin
            else None
        )
        self.kuberay = (
            KubeRayOperator(
                self,
                "KubeRayOperator",
                cluster=icluster,
                props=KubeRayOperatorProps(),
                after=[self.namespaces.manifests[KUBERAY.name], system_nodes],
            )
            if config.kuberay_operator
            else None
        )
        self.node_monitoring = (
            NodeMonitoringAgent(self, "NodeMonitoringAgent", cluster=icluster) if config.node_monitoring_agent else None
        )
        self.checkpoints = None
        if config.checkpoint_storage is not None:
            self.checkpoints = FsxCheckpointStorage(
                self,
                "CheckpointStorage",
                cluster=cluster.cluster,
                icluster=icluster,
                vpc=network.vpc,
                subnet=network.vpc.select_subnets(
                    subnet_type=network.private_subnets.subnet_type,
                    availability_zones=[environment.gpu_availability_zone],
                ).subnets[0],
                config=config.checkpoint_storage,
                environment=environment.name,
                after=[cluster.addons["eks-pod-identity-agent"], system_nodes],
            )
            self.checkpoints.claim.node.add_dependency(self.namespaces.manifests["training"])

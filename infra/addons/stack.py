"""Wires the enabled cluster-wide add-ons of an environment in their declared order (Platform stack).

The NVIDIA and EFA device plugins live here, not in the GPU stacks. They are DaemonSets selected
by the label every GPU group carries: they run on each GPU node whenever one appears, in any
group, and on none while every group is at desired 0 (helm's --wait counts a DaemonSet with 0
desired pods as ready). A chart in a GPU stack would tie the plugin's life to one group (two
groups would fight over one release name) and make that stack's rollback also remove the
plugins of the other groups. Installed with the cluster, they are running before the first GPU
node registers, so a node never advertises GPUs/EFA late.
(The FSx checkpoint storage is its own stack: infra/stage.py StorageStack.)
"""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.addons.efa_device_plugin import EfaDevicePlugin, efa_props_for_region
from infra.addons.kuberay_operator import KubeRayOperator, KubeRayOperatorProps
from infra.addons.kueue import Kueue
from infra.addons.namespaces import PlatformNamespaces
from infra.addons.node_monitoring import NodeMonitoringAgent
from infra.addons.nvidia_device_plugin import NvidiaDevicePlugin, NvidiaDevicePluginProps
from infra.addons.observability import CloudWatchObservability
from infra.cluster import EksCluster
from infra.spec import Environment
from infra.spec.kueue import KUEUE, kueue_props
from infra.spec.namespaces import KUBERAY, TRAINING_NAMESPACES


class ClusterAddOns(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        cluster: EksCluster,
        system_nodes: eks.Nodegroup,
    ) -> None:
        super().__init__(scope, construct_id)
        config = environment.add_ons
        icluster = cluster.icluster
        # Manifests go through the kubectl Lambda, which needs a node-less but ready API.
        namespaces = (
            *TRAINING_NAMESPACES,
            *((KUBERAY,) if config.kuberay_operator else ()),
            *((KUEUE,) if config.kueue else ()),
        )
        self.namespaces = PlatformNamespaces(
            self,
            "Namespaces",
            cluster=icluster,
            environment=environment.name,
            namespaces=namespaces,
            vpc_cidr=environment.network.cidr,
        )

        self.nvidia = (
            NvidiaDevicePlugin(
                self,
                "NvidiaDevicePlugin",
                cluster=icluster,
                props=NvidiaDevicePluginProps(),
            )
            if config.nvidia_device_plugin
            else None
        )
        self.efa = (
            EfaDevicePlugin(self, "EfaDevicePlugin", cluster=icluster, props=efa_props_for_region(environment.region))
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
        # After KubeRay: the manager sets up its RayJob/RayCluster integrations at start, from the
        # ray.io CRDs the KubeRay chart installs.
        self.kueue = (
            Kueue(
                self,
                "Kueue",
                cluster=icluster,
                environment=environment,
                props=kueue_props(config.kuberay_operator),
                after=[
                    self.namespaces.manifests[KUEUE.name],
                    system_nodes,
                    *((self.kuberay.chart,) if self.kuberay is not None else ()),
                ],
                queues_after=[self.namespaces.manifests[ns.name] for ns in TRAINING_NAMESPACES],
            )
            if config.kueue
            else None
        )
        # Workload namespaces after both controllers: CloudFormation deletes in reverse dependency order, so the
        # namespaces (and the Jobs, RayJobs, RayClusters and Workloads in them) go while the Kueue and KubeRay
        # controllers still run to clear their finalizers; deleted in parallel with the charts, the objects keep
        # finalizers nobody removes and the kubectl handler's `kubectl delete` (--wait) runs past its
        # 15-minute Lambda timeout (aws-cdk-lib 2.275.0 custom-resource-handlers/dist/aws-eks-v2/kubectl-handler).
        controllers = [
            c
            for c in (self.kuberay.chart if self.kuberay else None, self.kueue.release.chart if self.kueue else None)
            if c
        ]
        for spec in TRAINING_NAMESPACES:
            for controller in controllers:
                self.namespaces.manifests[spec.name].node.add_dependency(controller)

        self.node_monitoring = (
            NodeMonitoringAgent(self, "NodeMonitoringAgent", cluster=icluster) if config.node_monitoring_agent else None
        )
        # The agent's pod needs its Pod Identity credentials and a node to run on.
        self.observability = (
            CloudWatchObservability(
                self,
                "CloudWatchObservability",
                cluster=icluster,
                cluster_name=environment.cluster.name,
                cluster_name_token=cluster.cluster.cluster_name,
                after=[cluster.addons["eks-pod-identity-agent"], system_nodes],
            )
            if config.observability
            else None
        )

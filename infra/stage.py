"""One Stage per environment, split into stacks by blast radius; the stacks only wire constructs.

    <env>/Images        the NVRx job's image: ECR repository, CodeBuild build of images/nvrx at deploy
                        (<cluster>-images; depends on nothing: deploys first, or alone; infra/images.py)
    <env>/Platform      network, cluster, system nodes, core add-ons, device plugins (<cluster>-platform)
    <env>/Storage       FSx checkpoint file system and its security group (both retained), client rules, CSI driver,
                        StorageClass/PV/PVC (<cluster>-storage; only with checkpoint storage)
    <env>/Gpu-<group>   one per GPU node group: EFA security group, placement group, launch template,
                        node group (<cluster>-gpu-<group>)

A managed node group finishes creating only once its instances launch; a GPU shortage
(InsufficientInstanceCapacity) fails it and rolls back its whole stack. In a stack of its own
that rolls back one GPU group, never the VPC and cluster. Storage and every Gpu-<group> depend
on Platform only, so each deploys alone after it (`cdk deploy 'prod/Gpu-p5'`); Images depends on nothing.

Values cross stacks as construct attributes; nothing is exported by hand. cdk.json sets
`@aws-cdk/core:defaultCrossStackReferences: weak`: a consumer reads a Platform output with
Fn::GetStackOutput, resolved only when the consumer is created or updated, with no lock on Platform.
Strong references (an export of Platform, Fn::ImportValue here) are set per producer where a lock is the
safety: the cluster (name, security group), the VPC, and the kubectl provider's function, whose ARN is
the ServiceToken of every KubernetesManifest/HelmChart here and is create-only on a custom resource
(infra/cluster.py, infra/network.py). CloudFormation then refuses to replace them, or to delete Platform,
while a consumer uses them. The GPU subnet and the alarm topic stay weak: a zone move switches the
consumers to another subnet, which an export still in use would block. `trainctl plan --env E` names the
consumers of a replaced, weakly read Platform resource (docs/changes.md, "Changing Platform").
aws_eks_v2's KubernetesManifest/HelmChart/Addon in a stack other than the cluster's are supported: they
read `cluster.kubectlProvider.serviceToken` and depend on the cluster's KubectlReadyBarrier (aws-cdk-lib
2.275.0 aws-eks-v2/lib/k8s-manifest.js, helm-chart.js, kubectl-provider.js `getKubectlProvider` ->
`_dependOnKubectlBarrier`), which CDK turns into a stack dependency on Platform.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Fn, Stack, Stage, Tags
from aws_cdk import Environment as CdkEnvironment
from constructs import Construct

from infra.addons.fsx_checkpoints import FsxCheckpointStorage
from infra.addons.stack import ClusterAddOns
from infra.cluster import EksCluster
from infra.images import NvrxImageBuild
from infra.monitoring import AlarmTopic, EnvironmentDashboard, GpuGroupAlarms
from infra.network import Network
from infra.nodegroups.efa import EfaNodeGroup
from infra.nodegroups.system import SystemNodeGroup
from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.checkpoint_volumes import CLAIM_NAMESPACES
from infra.spec.images import images_stack_name
from infra.spec.replacement_names import gpu_nodegroup_name, system_nodegroup_name


class ImagesStack(Stack):
    """The environment's built images; reads nothing from another stack, so it deploys before Platform or alone."""

    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment, **kwargs: object) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.nvrx = NvrxImageBuild(self, "NvrxImage", environment=environment)
        CfnOutput(self, "NvrxImageUri", value=self.nvrx.image_uri)
        CfnOutput(self, "NvrxImageDigest", value=self.nvrx.digest)
        CfnOutput(
            self,
            "PinCommand",
            value=Fn.join("", [f"trainctl pin --built {environment.name} --account ", self.account]),
            description="Pins the built image's digest in k8s/images.lock.json; commit it and run make synth.",
        )


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
            nodegroup_name=system_nodegroup_name(environment),
        )
        self.cluster.order_before(self.system_nodes.nodegroup)
        self.cluster.order_coredns_after(self.system_nodes.nodegroup)

        self.add_ons = ClusterAddOns(
            self,
            "AddOns",
            environment=environment,
            cluster=self.cluster,
            system_nodes=self.system_nodes.nodegroup,
        )

        # Alarms live in each Gpu-<group> stack; their topic and the dashboard here (infra/monitoring.py).
        self.alarm_topic = (
            AlarmTopic(self, "AlarmTopic", environment=environment) if environment.add_ons.observability else None
        )
        self.dashboard = (
            EnvironmentDashboard(self, "Dashboard", environment=environment)
            if environment.add_ons.observability and environment.gpu_node_groups
            else None
        )

        CfnOutput(self, "ClusterName", value=self.cluster.cluster.cluster_name)
        CfnOutput(
            self,
            "UpdateKubeconfigCommand",
            value=f"aws eks update-kubeconfig --name {environment.cluster.name} --region {environment.region}",
            description="The endpoint is private: run it from inside the VPC (VPN, SSM, a bastion).",
        )


class StorageStack(Stack):
    """Stateful storage: the retained FSx file system lives here and nowhere else."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        platform: PlatformStack,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        config = environment.add_ons.checkpoint_storage
        assert config is not None  # the Stage creates this stack only with checkpoint storage
        network, cluster = platform.network, platform.cluster
        self.checkpoints = FsxCheckpointStorage(
            self,
            "CheckpointStorage",
            cluster=cluster.cluster,
            icluster=cluster.icluster,
            vpc=network.vpc,
            subnet=network.vpc.select_subnets(
                subnet_type=network.private_subnets.subnet_type,
                availability_zones=[environment.gpu_availability_zone],
            ).subnets[0],
            config=config,
            environment=environment,
            after=[cluster.addons["eks-pod-identity-agent"], platform.system_nodes.nodegroup],
        )
        for namespace in CLAIM_NAMESPACES:
            self.checkpoints.claim.node.add_dependency(platform.add_ons.namespaces.manifests[namespace.name])


class GpuNodeGroupStack(Stack):
    """One GPU node group and what belongs to it alone; a capacity failure rolls back only this."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        group: GpuNodeGroupConfig,
        platform: PlatformStack,
        **kwargs: object,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        cluster = platform.cluster
        self.nodes = EfaNodeGroup(
            self,
            f"GpuNodes-{group.name}",
            cluster=cluster.icluster,
            cluster_security_group_id=cluster.cluster.cluster_security_group_id,
            vpc=platform.network.vpc,
            subnets=platform.network.private_subnet_in(environment.gpu_availability_zone),
            config=group,
            nodegroup_name=gpu_nodegroup_name(environment, group),
        )
        cluster.order_before(self.nodes.nodegroup)
        self.alarms = (
            GpuGroupAlarms(
                self, f"Alarms-{group.name}", environment=environment, group=group, topic=platform.alarm_topic.topic
            )
            if platform.alarm_topic is not None
            else None
        )


class PlatformStage(Stage):
    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment) -> None:
        super().__init__(
            scope,
            construct_id,
            env=CdkEnvironment(account=environment.account, region=environment.region),
        )
        self.environment = environment
        cluster_name = environment.cluster.name
        # The NVRx job, the only user of a built image, exists where there are GPU groups (k8s/built_images.py).
        self.images = (
            ImagesStack(
                self,
                "Images",
                environment=environment,
                stack_name=images_stack_name(cluster_name),
                description=f"EKS ML training platform, environment {environment.name}: the NVRx job's image",
            )
            if environment.gpu_node_groups
            else None
        )
        self.platform = PlatformStack(
            self,
            "Platform",
            environment=environment,
            stack_name=f"{cluster_name}-platform",
            description=f"EKS ML training platform, environment {environment.name}: network, cluster, add-ons",
        )
        self.storage = (
            StorageStack(
                self,
                "Storage",
                environment=environment,
                platform=self.platform,
                stack_name=f"{cluster_name}-storage",
                description=f"EKS ML training platform, environment {environment.name}: checkpoint storage",
            )
            if environment.add_ons.checkpoint_storage is not None
            else None
        )
        self.gpu = {
            group.name: GpuNodeGroupStack(
                self,
                f"Gpu-{group.name}",
                environment=environment,
                group=group,
                platform=self.platform,
                stack_name=f"{cluster_name}-gpu-{group.name}",
                description=f"EKS ML training platform, environment {environment.name}: GPU node group {group.name}",
            )
            for group in environment.gpu_node_groups
        }
        for stack in self.stacks:
            Tags.of(stack).add("platform:environment", environment.name)
            for key, value in environment.tags.items():
                Tags.of(stack).add(key, value)

    @property
    def stacks(self) -> list[Stack]:
        """Every stack of the environment, in deploy order: Images, Platform, Storage, then each GPU group."""
        images: list[Stack] = [self.images] if self.images is not None else []
        rest: list[Stack] = [self.storage] if self.storage is not None else []
        return [*images, self.platform, *rest, *self.gpu.values()]

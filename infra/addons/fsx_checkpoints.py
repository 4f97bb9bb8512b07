"""Checkpoint storage: FSx for Lustre in the GPU zone, its CSI driver, and the claim jobs mount.

The file system is created here and bound statically (PersistentVolume with its id, DNS
name and mount name), so the CSI controller only ever describes it. A claim binds exactly one
volume and lives in one namespace, so each workload namespace (CLAIM_NAMESPACES) gets its own
static volume of the same file system and a claim that binds it: the NVRx job's checkpoints in
`training`, Ray Train's storage_path in `ray` (mounted on the Ray head and every worker, which
Ray Train 2.58 requires of a non-URI storage path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from constructs import Construct, IDependable

from infra.spec import CheckpointStorageConfig, Environment, LustreDeployment
from infra.spec.checkpoint_volumes import CLAIM_NAMESPACES, checkpoint_manifests, volume_names
from infra.spec.versions import MANAGED_ADDONS
from infra.trust import pod_identity_principal

ADDON = "aws-fsx-csi-driver"
CONTROLLER_SERVICE_ACCOUNT = "fsx-csi-controller-sa"
# Lustre clients reach the file servers on TCP 988 and 1018-1023 (FSx Lustre user guide,
# "File system access control with Amazon VPC").
LUSTRE_PORT_RANGES = ((988, 988), (1018, 1023))
LUSTRE_PORTS = tuple(
    ec2.Port.tcp_range(low, high) if low != high else ec2.Port.tcp(low) for low, high in LUSTRE_PORT_RANGES
)


def controller_configuration(region: str) -> dict[str, Any]:
    """The add-on's configuration values: the controller is told its region.

    Why (aws-fsx-csi-driver v1.9.0, the pinned add-on's driver, and its Helm chart 1.17.0, appVersion 1.9.0):
    - The controller takes its region from AWS_REGION, else from IMDS, else from the Kubernetes API
      (pkg/driver/controller.go newControllerService; pkg/cloud/metadata.go NewMetadataService), and the
      Kubernetes-API answer for an EC2 node carries the instance id only, no region
      (pkg/cloud/metadata_k8s.go metadataForEC2Node); its FSx client then has no region.
    - The controller Deployment is not on the host network (charts/aws-fsx-csi-driver/templates/
      controller-deployment.yaml sets no hostNetwork), so with the nodes' IMDS hop limit of 1
      (infra/nodegroups/launch_template.py) IMDS does not answer it. The variables EKS Pod Identity adds to a
      pod, as the EKS user guide lists them, are the two credential ones, no region
      (https://docs.aws.amazon.com/eks/latest/userguide/pod-id-how-it-works.html).
    - The chart's `controller.region` becomes the controller's AWS_REGION (controller-deployment.yaml;
      values.yaml: "If not specified then the region will be looked up via the AWS EC2 metadata service"), and
      the driver's docs/install.md ("EKS Auto Mode") sets it for nodes that block pods from IMDS.
      https://github.com/kubernetes-sigs/aws-fsx-csi-driver/blob/master/docs/install.md
    The node plugin needs no region: NodeGetInfo answers with CSI_NODE_NAME (pkg/driver/node.go).
    Not checked here: that the add-on's configuration schema (`aws eks describe-addon-configuration --addon-name
    aws-fsx-csi-driver --addon-version <pin>`) lists `controller.region`; EKS refuses a value it does not list.
    """
    return {"controller": {"region": region}}


class FsxCheckpointStorage(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        icluster: eks.ICluster,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        config: CheckpointStorageConfig,
        environment: Environment,
        after: Sequence[IDependable],
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config

        # Only the nodes (every managed node carries the cluster security group) and the
        # file servers themselves may speak Lustre to the file system.
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="FSx for Lustre checkpoints: Lustre from the cluster nodes only",
            allow_all_outbound=False,
        )
        node_sg_id = cluster.cluster_security_group_id
        node_sg = ec2.Peer.security_group_id(node_sg_id)
        for port in LUSTRE_PORTS:
            self.security_group.add_ingress_rule(node_sg, port, "Lustre from cluster nodes")
            self.security_group.add_ingress_rule(self.security_group, port, "Lustre between file servers")
            self.security_group.add_egress_rule(self.security_group, port, "Lustre between file servers")
            self.security_group.add_egress_rule(node_sg, port, "Lustre to cluster nodes")

        # Client side: the file servers open connections back to the clients (callbacks, lock
        # revocations), so the clients' security group must admit TCP 988 and 1018-1023 from the
        # file system's group (FSx for Lustre user guide, "Limit access with security groups":
        # rules for the Lustre clients). Every managed node's IP interfaces carry the cluster
        # security group (GPU interfaces carry it beside the EFA group, infra/nodegroups/efa.py),
        # so rules on that group cover system and GPU nodes alike.
        self.client_rules = [
            ec2.CfnSecurityGroupIngress(
                self,
                f"ClientIngress{port.to_string().replace(' ', '')}",
                group_id=node_sg_id,
                source_security_group_id=self.security_group.security_group_id,
                ip_protocol="tcp",
                from_port=from_port,
                to_port=to_port,
                description="Lustre from the FSx checkpoint file servers",
            )
            for port, (from_port, to_port) in zip(LUSTRE_PORTS, LUSTRE_PORT_RANGES, strict=True)
        ]

        # The L1 resource: the L2 LustreFileSystem opens 988-1023 within its group on its
        # own, and the rules here should be exactly the Lustre ports.
        self.file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_capacity=config.storage_capacity_gib,
            subnet_ids=[subnet.subnet_id],
            security_group_ids=[self.security_group.security_group_id],
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type=config.deployment.value,
                per_unit_storage_throughput=(
                    config.throughput_per_tib if config.deployment is LustreDeployment.PERSISTENT_2 else None
                ),
                data_compression_type="LZ4",
            ),
        )
        # Retained together: FSx keeps ENIs carrying this group in the GPU subnet for as long as the file
        # system exists, and EC2 refuses to delete a group with ENIs. A deleted group beside a retained file
        # system fails every rollback after the file system was created (ROLLBACK_FAILED) and every stack
        # delete (DELETE_FAILED). Both outlive the stack; the file system is deleted by hand, then the group
        # (docs/deploy.md, "Teardown"). The trade-off of retaining: the checkpoints survive a stack delete or a
        # replacement, and each survivor is billed until someone deletes it.
        self.file_system.apply_removal_policy(RemovalPolicy.RETAIN)
        self.security_group.apply_removal_policy(RemovalPolicy.RETAIN)
        # CreateFileSystem validates the group's rules ("security groups do not permit Lustre LNET
        # network traffic on port 988"); the rules are resources of their own, which the Ref to
        # the group id does not order. Depending on the group construct covers every rule
        # below it; the client rules are separate resources.
        self.file_system.node.add_dependency(self.security_group)
        for rule in self.client_rules:
            self.file_system.node.add_dependency(rule)

        # Pod Identity for the CSI controller: static volumes need describe only.
        self.controller_role = iam.Role(
            self,
            "ControllerRole",
            assumed_by=pod_identity_principal(
                self,
                cluster_name=environment.cluster.name,
                namespace="kube-system",
                service_account=CONTROLLER_SERVICE_ACCOUNT,
            ),
            description="FSx CSI controller (EKS Pod Identity): describe the checkpoint file system",
        )
        self.controller_role.add_to_policy(iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"]))
        self.pod_identity = eks.CfnPodIdentityAssociation(
            self,
            "PodIdentity",
            cluster_name=cluster.cluster_name,
            namespace="kube-system",
            service_account=CONTROLLER_SERVICE_ACCOUNT,
            role_arn=self.controller_role.role_arn,
        )
        self.addon = eks.Addon(
            self,
            "CsiDriver",
            cluster=icluster,
            addon_name=ADDON,
            addon_version=MANAGED_ADDONS[ADDON],
            configuration_values=controller_configuration(environment.region),
        )
        self.addon.node.add_dependency(self.pod_identity)
        for dependency in after:
            self.addon.node.add_dependency(dependency)

        self.environment = environment
        # Named after the file system's zone: a zone move replaces the file system, and the volumes of the
        # new one must be new objects (infra/spec/replacement_names.py).
        self.volume_names = volume_names(environment, config)
        self.volume_name = self.volume_names[CLAIM_NAMESPACES[0].name]
        self.claim = eks.KubernetesManifest(
            self,
            "Claim",
            cluster=icluster,
            manifest=self.manifests(availability_zone=subnet.availability_zone),
            overwrite=True,
        )
        # (The file system is already ordered before it by the Ref to its id.)
        self.claim.node.add_dependency(self.addon)

    def manifests(self, *, availability_zone: str) -> list[dict[str, Any]]:
        return checkpoint_manifests(
            self.environment,
            self.config,
            availability_zone=availability_zone,
            volume_handle=self.file_system.ref,
            dns_name=self.file_system.attr_dns_name,
            mount_name=self.file_system.attr_lustre_mount_name,
        )

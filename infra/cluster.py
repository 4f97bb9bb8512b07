"""The EKS control plane (aws_eks_v2): private endpoint, full logging, KMS-encrypted secrets, access entries."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

from aws_cdk import ArnFormat, Aws, CfnResource, CrossStackReferences, ReferenceStrength, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer
from constructs import Construct, IConstruct

from infra.library_roles import Statements, rewrite_policy_statements, write_managed_policies
from infra.logs import retention_days
from infra.spec import ClusterConfig, EndpointAccess
from infra.spec.versions import CORE_ADDONS, HELM_CHARTS, KUBERNETES_VERSION, MANAGED_ADDONS
from infra.trust import cluster_arn, confine_library_trust, pod_identity_principal, source_conditions

ALL_LOG_TYPES = (
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
)

CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"

# Add-ons nodes need before they can turn Ready. coredns is the exception: its pods
# need a node to run on, so it is created after the first node group instead.
ADDONS_BEFORE_NODES = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")

# The VPC CNI's AWS permissions on an identity of its own, not on the node role (infra/nodegroups/node_role.py):
# an EKS Pod Identity association of the vpc-cni add-on for kube-system/aws-node, with a role that carries the AWS
# managed policy for IPv4 clusters. Sources:
# - EKS Best Practices, "Update the aws-node daemonset to use IRSA": the node role's AmazonEKS_CNI_Policy lets
#   every pod on a node attach and detach ENIs and assign IP addresses; "The aws-node daemonset supports EKS Pod
#   Identities in versions v1.15.5 and later" (pinned: infra/spec/versions.py).
#   https://docs.aws.amazon.com/eks/latest/best-practices/identity-and-access-management.html
# - EKS user guide, "IAM roles for Amazon EKS add-ons", Pod Identity Support Reference: Amazon VPC CNI, minimum
#   v1.15.5-eksbuild.1. Associations made through the add-on are owned by it, and "If you update the pod identity
#   associations for an existing add-on, Amazon EKS initiates a rolling restart of the add-on pods": aws-node
#   restarts with its own credentials, which a standalone AWS::EKS::PodIdentityAssociation would not do.
#   https://docs.aws.amazon.com/eks/latest/userguide/add-ons-iam.html
# - EKS user guide, "Configure Amazon VPC CNI plugin to use IRSA": the plugin runs as service account aws-node,
#   needs AmazonEKS_CNI_Policy on an IPv4 cluster, "also supports Amazon EKS Pod Identities", and the guide
#   recommends a separate role over the node role. https://docs.aws.amazon.com/eks/latest/userguide/cni-iam-role.html
# Order: vpc-cni waits for eks-pod-identity-agent, whose host-network DaemonSet hands aws-node its credentials
# (EKS user guide, "EKS Pod Identity considerations": the agent "uses the hostNetwork of the node",
# https://docs.aws.amazon.com/eks/latest/userguide/pod-identities.html), and node groups wait for both
# (ADDONS_BEFORE_NODES); a node role is part of its node group's construct, so on an existing cluster it loses
# AmazonEKS_CNI_Policy only after the vpc-cni update that gives aws-node its association.
VPC_CNI_ADDON = "vpc-cni"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"  # in kube-system, the add-on's namespace
VPC_CNI_POLICY = "AmazonEKS_CNI_Policy"
POD_IDENTITY_AGENT_ADDON = "eks-pod-identity-agent"
# Any API server accepts NetworkPolicy objects; on EKS only the VPC CNI's node agent enforces them, and only with the
# add-on's enableNetworkPolicy "true" (EKS user guide, "Restrict Pod network traffic with Kubernetes network policies",
# https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html). Standard enforcing mode: a pod
# no policy selects is open, and a new pod starts open until the agent has written its policies ("default allow"
# while they are configured, the same page, Step 1). Strict mode (NETWORK_POLICY_ENFORCING_MODE=strict) would start
# every pod denied both ways and need a policy for each endpoint any pod reaches, CoreDNS and the API server included,
# on every namespace of the cluster: our policies are ingress only. The window is the pod's start, before its
# launcher listens on a rendezvous or a Ray port.
ADDON_CONFIGURATION: dict[str, dict[str, str]] = {VPC_CNI_ADDON: {"enableNetworkPolicy": "true"}}


def kubectl_provider_function(cluster: eks.Cluster) -> IConstruct:
    """The function whose ARN is the kubectl provider's service token (aws-cdk-lib 2.275.0 aws-eks-v2
    kubectl-provider.js: `cr.Provider(this, "Provider")`, serviceToken = the framework's onEvent function)."""
    found = cluster.node.try_find_child("KubectlProvider")
    provider = found.node.try_find_child("Provider") if found is not None else None
    function = provider.node.try_find_child("framework-onEvent") if provider is not None else None
    if function is None:
        raise LookupError("aws_eks_v2.Cluster has no KubectlProvider/Provider/framework-onEvent (aws-cdk-lib moved it)")
    return function


# aws-cdk-lib 2.275.0 (aws-eks-v2/lib/kubectl-provider.js) attaches AmazonEC2ContainerRegistryReadOnly and, in the
# aws partition, AmazonElasticContainerRegistryPublicReadOnly to the kubectl handler's role, so that HelmChart can
# log in to a chart kept in ECR (kubectl-handler/helm get_oci_cmd logs in only for *.dkr.ecr.* and public.ecr.aws).
# None of our charts is kept there, and invoking that function is cluster-admin already: it keeps the two Lambda
# policies it runs with (logs; ENIs in the VPC) and no registry read.
KUBECTL_HANDLER_POLICIES = ("service-role/AWSLambdaBasicExecutionRole", "service-role/AWSLambdaVPCAccessExecutionRole")
ECR_CHART = re.compile(r"^oci://(\d+\.dkr\.ecr\.|public\.ecr\.aws)")


def drop_kubectl_registry_read(cluster: eks.Cluster) -> None:
    ecr_charts = sorted(pin.chart for pin in HELM_CHARTS.values() if ECR_CHART.match(pin.repository))
    if ecr_charts:
        raise ValueError(
            f"Helm chart(s) {ecr_charts} are kept in ECR, which the kubectl handler may not read: keep its registry "
            "read (infra/cluster.py drop_kubectl_registry_read) or serve the chart from another registry"
        )
    handler = cluster.node.find_child("KubectlProvider").node.find_child("Handler")
    # The library's partition condition for ECR Public (HasEcrPublic) has no other use: CloudFormation warns on an
    # unused condition (cfn-lint W8001).
    if not handler.node.try_remove_child("HasEcrPublic"):
        raise LookupError("aws_eks_v2 kubectl Handler has no HasEcrPublic condition (aws-cdk-lib moved it)")
    role = handler.node.try_find_child("ServiceRole")
    write_managed_policies(role, KUBECTL_HANDLER_POLICIES, "aws_eks_v2 KubectlProvider/Handler/ServiceRole")


def principal_arn(principal: str) -> str:
    """A role name becomes a role ARN in the deploying account; ARNs pass through."""
    if principal.startswith("arn:"):
        return principal
    return f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/{principal}"


def _endpoint_access(config: ClusterConfig) -> eks.EndpointAccess:
    if config.endpoint_access is EndpointAccess.PRIVATE:
        return eks.EndpointAccess.PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*config.public_access_cidrs)


def control_plane_log_group_name(cluster_name: str) -> str:
    return f"/aws/eks/{cluster_name}/cluster"


def control_plane_log_retention(scope: Construct, config: ClusterConfig) -> logs.LogRetention:
    """Retention for the control-plane log group, which this stack never owns.

    EKS writes control-plane logs to `/aws/eks/<cluster>/cluster` and creates that group itself
    when logging is on (EKS user guide, "Send control plane logs to CloudWatch Logs"). Owning it
    as an `AWS::Logs::LogGroup` with RETAIN makes every later create fail: after a rollback or a
    destroyed environment the retained group is still there and CloudFormation reports
    "already exists" until someone deletes it by hand. `aws_logs.LogRetention` is a custom
    resource instead: its handler creates the group when it is missing, adopts it when it exists
    (ResourceAlreadyExistsException is ignored), sets the retention, and leaves the group (and
    its logs) in place on delete (removal_policy RETAIN). Ordered before the cluster, so the
    first log lines already land in a group with a retention. The library lets its handler change the retention of
    every log group; keep_log_retention_to_its_groups scopes it to this group and its own.
    """
    return logs.LogRetention(
        scope,
        "ControlPlaneLogRetention",
        log_group_name=control_plane_log_group_name(config.name),
        retention=retention_days(config.control_plane_log_retention_days),
        removal_policy=RemovalPolicy.RETAIN,
    )


# aws-cdk-lib 2.275.0 (aws-logs/lib/log-retention.js): one handler per stack, under this fixed id, whose role the
# library grants logs:PutRetentionPolicy and logs:DeleteRetentionPolicy on "*", any log group of the account. Its
# handler (custom-resource-handlers/dist/aws-logs/log-retention-handler) changes the group of each Custom::LogRetention
# and, on Create, gives its own /aws/lambda/<function> group one day; nothing else. Both are what it may change.
LOG_RETENTION_FUNCTION = "LogRetentionaae0aa3c5b4d4f87b02d85b201efdd8a"
LOG_RETENTION_ACTIONS = ("logs:DeleteRetentionPolicy", "logs:PutRetentionPolicy")


def log_group_arns(scope: Construct, name: str) -> list[str]:
    """The ARNs IAM may evaluate for a log group: `log-group:NAME` (the Service Authorization Reference's log-group
    resource) and `log-group:NAME:*` (the form DescribeLogGroups returns); neither matches another group."""
    return [
        Stack.of(scope).format_arn(
            service="logs", resource="log-group", resource_name=resource, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        for resource in (name, f"{name}:*")
    ]


def keep_log_retention_to_its_groups(retention: logs.LogRetention, names: Sequence[str]) -> iam.Policy:
    """Scopes the stack's LogRetention handler to `names` (the group of every Custom::LogRetention of the stack) and to
    its own log group, instead of the library's "*". The grant on its own group names the function, which depends on
    its role's default policy: it is a policy of its own, which every LogRetention of the stack waits for."""
    stack = Stack.of(retention)
    function = stack.node.try_find_child(LOG_RETENTION_FUNCTION)
    where = f"aws_logs.LogRetention {LOG_RETENTION_FUNCTION}/ServiceRole"
    if not isinstance(function, Construct):
        raise LookupError(f"{where}: no function there (aws-cdk-lib moved it)")
    role = function.node.try_find_child("ServiceRole")
    handler = function.node.default_child
    if not isinstance(role, iam.Role) or not isinstance(handler, CfnResource):
        raise LookupError(f"{where}: no role or function there (aws-cdk-lib moved them)")
    library = [{"Action": list(LOG_RETENTION_ACTIONS), "Effect": "Allow", "Resource": "*"}]

    def scoped(statements: Statements) -> Statements:
        if statements != library:
            raise LookupError(f"{where}/DefaultPolicy is no longer {library}: aws-cdk-lib changed it")
        return [{**library[0], "Resource": [arn for name in names for arn in log_group_arns(retention, name)]}]

    rewrite_policy_statements(role.node.try_find_child("DefaultPolicy"), scoped, f"{where}/DefaultPolicy")
    own = iam.Policy(
        function,
        "OwnLogGroupRetention",
        roles=[role],
        statements=[
            iam.PolicyStatement(
                actions=["logs:PutRetentionPolicy"],
                resources=log_group_arns(retention, f"/aws/lambda/{handler.ref}"),
            )
        ],
    )
    for found in stack.node.find_all():
        if isinstance(found, logs.LogRetention):
            found.node.add_dependency(own)
    return own


class EksCluster(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ClusterConfig,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Envelope encryption of Kubernetes secrets in EKS cluster {config.name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.control_plane_log_retention = control_plane_log_retention(self, config)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=config.name,
            version=eks.KubernetesVersion.of(KUBERNETES_VERSION),
            vpc=vpc,
            vpc_subnets=[subnets],
            endpoint_access=_endpoint_access(config),
            cluster_logging=list(ALL_LOG_TYPES),
            secrets_encryption_key=self.secrets_key,
            # Our own node groups only: no Auto Mode, no default capacity.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # Managed add-ons below replace the self-managed ones EKS would bootstrap.
            bootstrap_self_managed_addons=False,
            # Admins come from the environment's access entries, not from whoever deploys.
            bootstrap_cluster_creator_admin_permissions=False,
            output_config_command=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KubectlV36Layer(self, "KubectlLayer"),
                # The endpoint is private: the kubectl Lambda must run inside the VPC.
                private_subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets,
            ),
        )
        self.cluster.node.add_dependency(self.control_plane_log_retention)
        keep_log_retention_to_its_groups(self.control_plane_log_retention, [control_plane_log_group_name(config.name)])
        # Strong (an export each) against cdk.json's weak default: the Storage and Gpu-<group> stacks read the
        # cluster's name and security group, and the custom resources in Storage name the kubectl provider's
        # function as ServiceToken, which is create-only on a custom resource (the resource schema
        # AWS::CloudFormation::CustomResource, shipped with cfn-lint). Read weakly (Fn::GetStackOutput), a
        # Platform change that replaced them would go through and leave every consumer with a stale value
        # (the CDK CLI skips a consumer whose template did not change); with an export in use CloudFormation
        # refuses the replacement, and refuses deleting Platform while a consumer exists.
        CrossStackReferences.of(self.cluster).produce(ReferenceStrength.STRONG)
        CrossStackReferences.of(kubectl_provider_function(self.cluster)).produce(ReferenceStrength.STRONG)
        drop_kubectl_registry_read(self.cluster)
        # The cluster role is this cluster's (EKS User Guide, "Cross-service confused deputy prevention in Amazon EKS").
        confine_library_trust(
            self.cluster.role,
            "eks.amazonaws.com",
            source_conditions(self, [cluster_arn(self, config.name)]),
            "aws_eks_v2.Cluster Role",
        )
        # jsii's generated Cluster class misses a member of its own ICluster protocol
        # (kubectl_provider_options), so mypy needs telling that it is one.
        self.icluster = cast(eks.ICluster, self.cluster)

        self.admin_access = [
            eks.AccessEntry(
                self,
                f"Admin{index}",
                cluster=self.icluster,
                principal=principal_arn(principal),
                access_policies=[
                    eks.AccessPolicy.from_access_policy_name(
                        CLUSTER_ADMIN_POLICY, access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )
            for index, principal in enumerate(config.admin_principals)
        ]

        self.addons = {
            name: eks.Addon(
                self,
                f"Addon-{name}",
                cluster=self.icluster,
                addon_name=name,
                addon_version=MANAGED_ADDONS[name],
                configuration_values=ADDON_CONFIGURATION.get(name),
                preserve_on_delete=False,
            )
            for name in CORE_ADDONS
        }
        self.vpc_cni_role = iam.Role(
            self,
            "VpcCniRole",
            assumed_by=pod_identity_principal(
                self, cluster_name=config.name, namespace="kube-system", service_account=VPC_CNI_SERVICE_ACCOUNT
            ),
            description="VPC CNI, kube-system/aws-node (EKS Pod Identity of the vpc-cni add-on): node ENIs and IPs",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(VPC_CNI_POLICY)],
        )
        vpc_cni = self.addons[VPC_CNI_ADDON]
        # aws_eks_v2.Addon (2.275.0) has no podIdentityAssociations prop; its CfnAddon child has.
        cast(eks.CfnAddon, vpc_cni.node.default_child).pod_identity_associations = [
            eks.CfnAddon.PodIdentityAssociationProperty(
                service_account=VPC_CNI_SERVICE_ACCOUNT, role_arn=self.vpc_cni_role.role_arn
            )
        ]
        vpc_cni.node.add_dependency(self.addons[POD_IDENTITY_AGENT_ADDON])

    def order_before(self, nodegroup: eks.Nodegroup) -> None:
        """A node group waits for the add-ons its nodes need to turn Ready."""
        for name in ADDONS_BEFORE_NODES:
            nodegroup.node.add_dependency(self.addons[name])

    def order_coredns_after(self, nodegroup: eks.Nodegroup) -> None:
        """coredns waits for the (system) node group its pods run on."""
        self.addons["coredns"].node.add_dependency(nodegroup)

"""Every cdk-nag finding the project accepts: one resource (a construct path below the stack,
`*` only inside a name), one rule, one reason. Nothing is acknowledged at app, stage or stack
level; tests/gates check that each entry still matches something and nothing else slips by."""

from __future__ import annotations

from dataclasses import dataclass

from infra.spec import ENVIRONMENTS
from infra.spec.metrics import agent_log_groups

IAM4 = "AwsSolutions::AwsSolutions-IAM4"
IAM5 = "AwsSolutions::AwsSolutions-IAM5"


def _managed(policy: str) -> str:
    return f"{IAM4}[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]"


@dataclass(frozen=True, kw_only=True)
class Acknowledgment:
    path: str  # below the stack, e.g. "SystemNodes/Nodegroup/NodeGroupRole"
    rule: str
    reason: str


NODE_ROLE_REASON = (
    "The node role carries the AWS managed policies the EKS user guide ('Amazon EKS node IAM role') gives a node: "
    "the kubelet's EC2 and EKS describe calls and the Pod Identity agent's eks-auth:AssumeRoleForPodIdentity "
    "(AmazonEKSWorkerNodePolicy), ECR image pulls (AmazonEC2ContainerRegistryReadOnly), no write on any resource; "
    "AWS keeps them current. The VPC CNI's policy is not on it (infra/nodegroups/node_role.py), and with the IMDS "
    "hop limit 1 only host-network pods reach it."
)
VPC_CNI_REASON = (
    "The VPC CNI's own role, reached only by kube-system/aws-node through the vpc-cni add-on's EKS Pod Identity "
    "association (infra/cluster.py), carries AmazonEKS_CNI_Policy, the policy the EKS user guide prescribes for the "
    "plugin on an IPv4 cluster ('Configure Amazon VPC CNI plugin to use IRSA'); AWS keeps it current with the ENI "
    "and IP address calls the plugin makes."
)
# What the two AWS managed policies aws-cdk-lib attaches to a Lambda function's role grant, from their published
# documents (AWS Managed Policy Reference Guide): neither names a resource.
LAMBDA_LOGS = (
    "AWSLambdaBasicExecutionRole: logs:CreateLogGroup, CreateLogStream and PutLogEvents on every log group (the "
    "policy names none; a function writes to its own)"
)
LAMBDA_VPC = (
    "AWSLambdaVPCAccessExecutionRole: the same log grants and the network-interface calls of a function in a VPC "
    "(create, describe, delete, assign and unassign addresses), on '*'"
)
KUBECTL_HANDLER_REASON = (
    "Role of the kubectl handler Lambda that aws-cdk-lib's aws_eks_v2 creates to apply manifests and Helm charts, in "
    f"the VPC (the endpoint is private): {LAMBDA_LOGS}; {LAMBDA_VPC}. The registry read the library adds is removed "
    "(infra/cluster.py drop_kubectl_registry_read)."
)
KUBECTL_FRAMEWORK_REASON = (
    "Role of the Provider framework's onEvent function in front of the kubectl handler, which aws_eks_v2 puts in the "
    f"VPC too: {LAMBDA_LOGS}; {LAMBDA_VPC}. Its own grants are lambda:InvokeFunction and GetFunction on the kubectl "
    "handler alone."
)

# aws_logs.LogRetention's singleton handler (infra/cluster.py control_plane_log_retention); the id is
# fixed by aws-cdk-lib (LogRetention<uuid>) for one function per stack. Its grants are scoped in infra/cluster.py
# keep_log_retention_to_its_groups.
LOG_RETENTION = "LogRetentionaae0aa3c5b4d4f87b02d85b201efdd8a"
LOG_RETENTION_REASON = (
    "Role of aws-cdk-lib's LogRetention handler, which creates or adopts /aws/eks/<cluster>/cluster and sets "
    "its retention (the control-plane log group is not owned by the stack, so a retry never hits 'already exists')."
)
LOG_GROUP_SUFFIX_REASON = (
    "log-group:NAME:* is the form of a log group's ARN that ends in ':*' (DescribeLogGroups returns it), granted "
    "beside log-group:NAME: the wildcard is that suffix and matches no other group."
)
_LOG_RETENTION_ACKS: tuple[Acknowledgment, ...] = (
    Acknowledgment(
        path=f"{LOG_RETENTION}/ServiceRole",
        rule=_managed("service-role/AWSLambdaBasicExecutionRole"),
        reason=(
            f"{LOG_RETENTION_REASON} AWSLambdaBasicExecutionRole is aws-cdk-lib's choice for the handler's own logs: "
            "logs:CreateLogGroup, CreateLogStream and PutLogEvents on every log group (its statements name none); the "
            "handler uses CreateLogGroup to create the control-plane group when it is missing."
        ),
    ),
    *(
        Acknowledgment(
            path=f"{LOG_RETENTION}/ServiceRole/DefaultPolicy",
            rule=f"{IAM5}[Resource::arn:aws:logs:{env.region}:<AWS::AccountId>:log-group:/aws/eks/{env.cluster.name}"
            "/cluster:*]",
            reason=(
                f"{LOG_RETENTION_REASON} logs:PutRetentionPolicy and DeleteRetentionPolicy on that group alone (the "
                f"library's '*' is replaced). {LOG_GROUP_SUFFIX_REASON}"
            ),
        )
        for env in ENVIRONMENTS.values()
    ),
    *(
        Acknowledgment(
            path=f"{LOG_RETENTION}/OwnLogGroupRetention",
            rule=f"{IAM5}[Resource::arn:aws:logs:{env.region}:<AWS::AccountId>:log-group:/aws/lambda/"
            f"<{LOG_RETENTION}FD4BFC8A>:*]",
            reason=(
                "logs:PutRetentionPolicy on the LogRetention handler's own /aws/lambda/<function> group, which its "
                "code gives one day of retention when a LogRetention is created, and on no other group. "
                f"{LOG_GROUP_SUFFIX_REASON}"
            ),
        )
        for env in ENVIRONMENTS.values()
    ),
)

# The Images stack (infra/images.py): the NVRx image's CodeBuild project and its Provider-framework custom resource.
IMAGE_BUILD = "NvrxImage"
PROVIDER_LOGS_REASON = (
    "Role of a function of aws-cdk-lib's custom-resource Provider framework (framework-onEvent, isComplete, onTimeout) "
    f"over the NVRx image build, which the library gives {LAMBDA_LOGS}."
)
PROVIDER_INVOKE_REASON = (
    "aws-cdk-lib's Provider framework invokes the two handler functions of this construct (OnEvent, IsComplete) and "
    "any version of them (ARN:*): the wildcard is those functions' version suffix."
)
WAITER_INVOKE_REASON = (
    "The Provider framework's waiter state machine invokes the framework's isComplete and onTimeout functions and any "
    "version of them (ARN:*): the wildcard is those functions' version suffix."
)
HANDLER_LOGS_REASON = (
    "The NVRx image build's onEvent/isComplete handlers (infra/functions/image_build.py) carry the policy aws-cdk-lib "
    f"attaches to a Function's default role, {LAMBDA_LOGS}. Their other grants are on the project and the repository "
    "alone."
)
PROJECT_DEFAULTS_REASON = (
    "aws-cdk-lib's codebuild.Project writes these grants for its role: read of the build context's S3 asset object "
    "(Source.s3), the project's own /aws/codebuild/<project> log group and report groups named after it."
)
_IMAGE_BUILD_ACKS: tuple[Acknowledgment, ...] = (
    Acknowledgment(
        path=f"{IMAGE_BUILD}/Project",
        rule="AwsSolutions::AwsSolutions-CB4",
        reason=(
            "The build has no artifacts (its output is the pushed image, encrypted at rest by ECR) and no cache; "
            "CodeBuild encrypts the build environment with its AWS managed key. A customer key adds nothing kept."
        ),
    ),
    Acknowledgment(
        path=f"{IMAGE_BUILD}/Project/Role/DefaultPolicy",
        rule=f"{IAM5}[Resource::*]",
        reason=(
            "ecr:GetAuthorizationToken (the login to the environment's registry and, for a private base, to the "
            "DLC's), ecr-public:GetAuthorizationToken and sts:GetServiceBearerToken (the login to ECR Public for "
            "the base) support no resource-level permissions (Service Authorization Reference); push and pull are "
            "granted on the repositories alone."
        ),
    ),
    *(
        Acknowledgment(
            path=f"{IMAGE_BUILD}/Project/Role/DefaultPolicy", rule=f"{IAM5}[{finding}]", reason=PROJECT_DEFAULTS_REASON
        )
        for finding in ("Action::s3:GetBucket*", "Action::s3:GetObject*", "Action::s3:List*")
    ),
    *(
        Acknowledgment(
            path=f"{IMAGE_BUILD}/Project/Role/DefaultPolicy",
            rule=f"{IAM5}[Resource::{resource}]",
            reason=PROJECT_DEFAULTS_REASON,
        )
        for region in sorted({env.region for env in ENVIRONMENTS.values() if env.gpu_node_groups})
        for resource in (
            f"arn:aws:codebuild:{region}:<AWS::AccountId>:report-group/<NvrxImageProjectE3181CEF>-*",
            f"arn:aws:logs:{region}:<AWS::AccountId>:log-group:/aws/codebuild/<NvrxImageProjectE3181CEF>:*",
        )
    ),
    *(
        Acknowledgment(
            path=f"{IMAGE_BUILD}/{function}/ServiceRole",
            rule=_managed("service-role/AWSLambdaBasicExecutionRole"),
            reason=HANDLER_LOGS_REASON if "/" not in function else PROVIDER_LOGS_REASON,
        )
        for function in (
            "OnEvent",
            "IsComplete",
            "Provider/framework-onEvent",
            "Provider/framework-isComplete",
            "Provider/framework-onTimeout",
        )
    ),
    *(
        Acknowledgment(
            path=f"{IMAGE_BUILD}/Provider/framework-{function}/ServiceRole/DefaultPolicy",
            rule=f"{IAM5}[Resource::<{handler}.Arn>:*]",
            reason=PROVIDER_INVOKE_REASON,
        )
        for function in ("onEvent", "isComplete", "onTimeout")
        for handler in ("NvrxImageOnEventA5F2EE60", "NvrxImageIsCompleteBFE4F6EA")
    ),
    *(
        Acknowledgment(
            path=f"{IMAGE_BUILD}/Provider/waiter-state-machine/Role/DefaultPolicy",
            rule=f"{IAM5}[Resource::<{handler}.Arn>:*]",
            reason=WAITER_INVOKE_REASON,
        )
        for handler in ("NvrxImageProviderframeworkisComplete2E602B76", "NvrxImageProviderframeworkonTimeoutE48E2E6C")
    ),
    Acknowledgment(
        path=f"{IMAGE_BUILD}/Provider/waiter-state-machine/Role/DefaultPolicy",
        rule=f"{IAM5}[Resource::*]",
        reason=(
            "The waiter's logging grants (logs:CreateLogDelivery, GetLogDelivery, UpdateLogDelivery, "
            "DeleteLogDelivery, ListLogDeliveries, PutResourcePolicy, DescribeResourcePolicies, DescribeLogGroups) "
            "support no resource-level permissions: Step Functions' CloudWatch Logs delivery requires '*' "
            "(Step Functions developer guide, 'IAM policies for logging to CloudWatch Logs'). The log writes "
            "aws-cdk-lib adds beside them (logs:CreateLogStream, PutLogEvents on '*') are removed "
            "(infra/images.py keep_waiter_to_log_delivery)."
        ),
    ),
    Acknowledgment(
        path=f"{IMAGE_BUILD}/Provider/waiter-state-machine",
        rule="AwsSolutions::AwsSolutions-SF2",
        reason=(
            "The waiter is aws-cdk-lib's Provider-framework state machine, which offers no tracing option; it logs "
            "every state transition (level ALL) and the build's own logs are linked from a failure."
        ),
    ),
)

# The amazon-cloudwatch-observability add-on's agent role (infra/addons/observability.py agent_policy): no managed
# policy; log writes on its own groups only, EC2 describes for node metadata.
CLOUDWATCH_AGENT_ROLE = "AddOns/CloudWatchObservability/AgentRole"
_CLOUDWATCH_AGENT_ACKS: tuple[Acknowledgment, ...] = (
    Acknowledgment(
        path=CLOUDWATCH_AGENT_ROLE,
        rule=f"{IAM5}[Resource::*]",
        reason=(
            "ec2:DescribeTags and ec2:DescribeVolumes only (the Container Insights receiver's node tags and EBS volume "
            "ids); neither supports resource-level permissions (Service Authorization Reference, Amazon EC2). The "
            "role's log writes are on its own log groups and it has no cloudwatch:PutMetricData."
        ),
    ),
    *(
        Acknowledgment(
            path=CLOUDWATCH_AGENT_ROLE,
            rule=f"{IAM5}[Resource::arn:aws:logs:{env.region}:<AWS::AccountId>:log-group:{group}:*]",
            reason=(
                f"The log streams of {group}, one of the agent's and Fluent Bit's own log groups: CreateLogStream and "
                "PutLogEvents on streams named per node (Fluent Bit per node and container log, the agent per node). "
                "The role writes no other log group (not the control-plane group)."
            ),
        )
        for env in ENVIRONMENTS.values()
        if env.add_ons.observability
        for group in agent_log_groups(env.cluster.name)
    ),
)

ACKNOWLEDGMENTS: tuple[Acknowledgment, ...] = (
    Acknowledgment(
        path="Eks/Cluster/Role",
        rule=_managed("AmazonEKSClusterPolicy"),
        reason="The EKS cluster service role must carry AmazonEKSClusterPolicy (EKS user guide, cluster IAM role).",
    ),
    *(
        Acknowledgment(path=path, rule=_managed(policy), reason=NODE_ROLE_REASON)
        for path in ("SystemNodes/Nodegroup/NodeGroupRole", "GpuNodes-*/Nodegroup/NodeGroupRole")
        for policy in ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")
    ),
    Acknowledgment(path="Eks/VpcCniRole", rule=_managed("AmazonEKS_CNI_Policy"), reason=VPC_CNI_REASON),
    *(
        Acknowledgment(path=path, rule=_managed(f"service-role/{policy}"), reason=reason)
        for path, reason in (
            ("Eks/Cluster/KubectlProvider/Handler/ServiceRole", KUBECTL_HANDLER_REASON),
            ("Eks/Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole", KUBECTL_FRAMEWORK_REASON),
        )
        for policy in ("AWSLambdaBasicExecutionRole", "AWSLambdaVPCAccessExecutionRole")
    ),
    Acknowledgment(
        path="Eks/Cluster/KubectlProvider/Handler",
        rule="AwsSolutions::AwsSolutions-L1",
        reason=(
            "The kubectl handler's runtime is chosen by aws-cdk-lib to match the kubectl/helm layer it "
            "bundles; upgrading aws-cdk-lib moves it."
        ),
    ),
    Acknowledgment(
        path="Eks/Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole/DefaultPolicy",
        rule=f"{IAM5}[Resource::<EksClusterKubectlProviderHandlerDA75FB7A.Arn>:*]",
        reason=(
            "The Provider framework's onEvent function may invoke the kubectl handler and any version of it (ARN:*): "
            "the wildcard is that function's version suffix."
        ),
    ),
    *_LOG_RETENTION_ACKS,
    *_CLOUDWATCH_AGENT_ACKS,
    Acknowledgment(
        path="CheckpointStorage/ControllerRole/DefaultPolicy",
        rule=f"{IAM5}[Resource::*]",
        reason=(
            "fsx:DescribeFileSystems is the only action granted and it does not support resource-level "
            "permissions (Service Authorization Reference, Amazon FSx)."
        ),
    ),
    *_IMAGE_BUILD_ACKS,
)

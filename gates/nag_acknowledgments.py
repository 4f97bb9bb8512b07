"""Every cdk-nag finding the project accepts: one resource (a construct path below the stack,
`*` only inside a name), one rule, one reason. Nothing is acknowledged at app, stage or stack
level; tests/gates check that each entry still matches something and nothing else slips by."""

from __future__ import annotations

from dataclasses import dataclass

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
    "EKS managed node groups require this AWS managed policy on the node role "
    "(EKS user guide, 'Amazon EKS node IAM role'); AWS keeps it current with the kubelet and CNI."
)
KUBECTL_REASON = (
    "Role of the kubectl provider Lambda that aws-cdk-lib's aws_eks_v2 creates to apply manifests and Helm "
    "charts; its managed policies (logs, VPC ENIs, ECR pulls of the kubectl layer) are the library's."
)

# aws_logs.LogRetention's singleton handler (infra/cluster.py control_plane_log_retention); the id is
# fixed by aws-cdk-lib (LogRetention<uuid>) for one function per stack.
LOG_RETENTION = "LogRetentionaae0aa3c5b4d4f87b02d85b201efdd8a"
LOG_RETENTION_REASON = (
    "Role of aws-cdk-lib's LogRetention handler, which creates or adopts /aws/eks/<cluster>/cluster and sets "
    "its retention (the control-plane log group is not owned by the stack, so a retry never hits 'already exists')."
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
        for policy in ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")
    ),
    *(
        Acknowledgment(path=path, rule=_managed(f"service-role/{policy}"), reason=KUBECTL_REASON)
        for path in (
            "Eks/Cluster/KubectlProvider/Handler/ServiceRole",
            "Eks/Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole",
        )
        for policy in ("AWSLambdaBasicExecutionRole", "AWSLambdaVPCAccessExecutionRole")
    ),
    Acknowledgment(
        path="Eks/Cluster/KubectlProvider/Handler/ServiceRole",
        rule=_managed("AmazonEC2ContainerRegistryReadOnly"),
        reason=KUBECTL_REASON,
    ),
    Acknowledgment(
        path="Eks/Cluster/KubectlProvider/Handler/ServiceRole",
        rule=(
            f'{IAM4}[Policy::{{"Fn::If":["EksClusterKubectlProviderHandlerHasEcrPublicC426D1A5",'
            '{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
            '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}]'
        ),
        reason=KUBECTL_REASON,
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
        reason="The provider framework may invoke any version of its own handler function, and nothing else.",
    ),
    Acknowledgment(
        path=f"{LOG_RETENTION}/ServiceRole",
        rule=_managed("service-role/AWSLambdaBasicExecutionRole"),
        reason=(
            f"{LOG_RETENTION_REASON} AWSLambdaBasicExecutionRole gives the handler its own CloudWatch Logs and "
            "logs:CreateLogGroup, which it uses to create the control-plane group when it is missing."
        ),
    ),
    Acknowledgment(
        path=f"{LOG_RETENTION}/ServiceRole/DefaultPolicy",
        rule=f"{IAM5}[Resource::*]",
        reason=(
            f"{LOG_RETENTION_REASON} The policy grants logs:PutRetentionPolicy and logs:DeleteRetentionPolicy only; "
            "aws-cdk-lib writes it with Resource '*' because one handler serves every LogRetention of the stack."
        ),
    ),
    Acknowledgment(
        path="AddOns/CloudWatchObservability/AgentRole",
        rule=_managed("CloudWatchAgentServerPolicy"),
        reason=(
            "The amazon-cloudwatch-observability add-on's agent role carries the policy the CloudWatch user guide "
            "prescribes for it (Container-Insights-setup-EKS-addon, EKS Pod Identity); AWS keeps it in step with "
            "what the agent calls (PutMetricData, its log groups, EC2 describe for node metadata)."
        ),
    ),
    Acknowledgment(
        path="CheckpointStorage/ControllerRole/DefaultPolicy",
        rule=f"{IAM5}[Resource::*]",
        reason=(
            "fsx:DescribeFileSystems is the only action granted and it does not support resource-level "
            "permissions (Service Authorization Reference, Amazon FSx)."
        ),
    ),
)

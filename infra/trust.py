"""Who may assume a role that trusts an AWS service: the resource the service acts for, named with the condition keys
the service's guide documents for that role's trust policy (IAM User Guide, "The confused deputy problem"). The
template gate holds the same table to check every template (gates/templates.py TRUST_SOURCE_KEYS); services whose
guides document none are acknowledged there, with the reason.

    codebuild.amazonaws.com      aws:SourceAccount, aws:SourceArn = the project (CodeBuild User Guide, "Allow CodeBuild
                                 to interact with other AWS services")
    eks.amazonaws.com            aws:SourceAccount, aws:SourceArn = the cluster (EKS User Guide, "Cross-service confused
                                 deputy prevention in Amazon EKS")
    states.amazonaws.com         aws:SourceAccount, aws:SourceArn = stateMachine:* of the account and region (Step
                                 Functions Developer Guide, "Creating an IAM role for your state machine")
    vpc-flow-logs.amazonaws.com  aws:SourceAccount, aws:SourceArn = vpc-flow-log/* of the account and region (Amazon VPC
                                 User Guide, "IAM role for publishing flow logs to CloudWatch Logs": the flow log's
                                 id is not known before it exists)
    pods.eks.amazonaws.com       the session tags EKS Pod Identity sends: aws:RequestTag/eks-cluster-arn,
                                 kubernetes-namespace, kubernetes-service-account (EKS User Guide, "Create IAM role
                                 with trust policy required by EKS Pod Identity"): the role is its service account's
                                 on its cluster, whatever association another namespace or cluster makes with it
"""

from __future__ import annotations

from typing import Any, cast

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

POD_IDENTITY = "pods.eks.amazonaws.com"


def source_conditions(scope: Construct, source_arns: list[str]) -> dict[str, Any]:
    """The calling resource: this stack's account and an ARN the service acts for."""
    return {
        "StringEquals": {"aws:SourceAccount": Stack.of(scope).account},
        "ArnLike": {"aws:SourceArn": source_arns if len(source_arns) > 1 else source_arns[0]},
    }


def cluster_arn(scope: Construct, cluster_name: str) -> str:
    return Stack.of(scope).format_arn(service="eks", resource="cluster", resource_name=cluster_name)


def pod_identity_principal(
    scope: Construct, *, cluster_name: str, namespace: str, service_account: str
) -> iam.IPrincipal:
    """EKS Pod Identity (with the session tags it sends) for one service account of one cluster."""
    return iam.SessionTagsPrincipal(iam.ServicePrincipal(POD_IDENTITY)).with_conditions(
        {
            "StringEquals": {
                "aws:RequestTag/eks-cluster-arn": cluster_arn(scope, cluster_name),
                "aws:RequestTag/kubernetes-namespace": namespace,
                "aws:RequestTag/kubernetes-service-account": service_account,
            }
        }
    )


def confine_library_trust(role: IConstruct | None, service: str, conditions: dict[str, Any], where: str) -> None:
    """Adds `conditions` to the trust of a role aws-cdk-lib makes for `service` (the cluster's, the flow log's, the
    CodeBuild project's, the Provider waiter's), on its CloudFormation resource, which cdk-nag reads too: the same
    role (logical id and ARN), so nothing that names it is replaced."""
    if not isinstance(role, iam.Role):
        raise LookupError(f"{where}: no iam.Role there (aws-cdk-lib moved it)")
    document = Stack.of(role).resolve(role.assume_role_policy)
    statements = document["Statement"]
    library = {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": service}}
    if statements != [library]:
        raise LookupError(f"{where}: its trust is no longer {library} alone (aws-cdk-lib changed it)")
    cfn = cast(iam.CfnRole, role.node.default_child)
    cfn.assume_role_policy_document = {**document, "Statement": [{**library, "Condition": conditions}]}

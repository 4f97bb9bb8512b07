"""Roles aws-cdk-lib makes for its own constructs (a node group's, the kubectl handler's) whose AWS managed policies
this project writes itself: the library's role stays (same logical id and ARN, so nothing that names it is
replaced), with the policy list set on its CloudFormation resource, which the template and cdk-nag both read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from aws_cdk import aws_iam as iam
from constructs import IConstruct


def write_managed_policies(role: IConstruct | None, names: Sequence[str], where: str) -> iam.CfnRole:
    """Sets the AWS managed policies (`names`, e.g. "service-role/AWSLambdaBasicExecutionRole") of the library's
    `role`; `where` names it for the error when aws-cdk-lib no longer makes it there."""
    if not isinstance(role, iam.Role):
        raise LookupError(f"{where}: no iam.Role there (aws-cdk-lib moved it)")
    cfn = cast(iam.CfnRole, role.node.default_child)
    cfn.managed_policy_arns = [
        iam.ManagedPolicy.from_aws_managed_policy_name(name).managed_policy_arn for name in names
    ]
    return cfn

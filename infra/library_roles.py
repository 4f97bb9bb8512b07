"""Roles aws-cdk-lib makes for its own constructs (a node group's, the kubectl handler's, the LogRetention handler's,
the Provider framework's waiter) whose AWS managed policies or policy statements this project writes itself: the
library's role stays (same logical id and ARN, so nothing that names it is replaced), with the policy list or the
statements set on its CloudFormation resource, which the template and cdk-nag both read (cdk-nag does not see
property overrides)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from aws_cdk import Stack
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


Statements = list[dict[str, Any]]


def rewrite_policy_statements(
    policy: IConstruct | None, rewrite: Callable[[Statements], Statements], where: str
) -> iam.CfnPolicy:
    """Sets the statements of the library's `policy` to `rewrite(statements as the template would have them)`;
    `rewrite` raises LookupError when they are not the ones it was written for (aws-cdk-lib changed them)."""
    if not isinstance(policy, iam.Policy):
        raise LookupError(f"{where}: no iam.Policy there (aws-cdk-lib moved it)")
    document = Stack.of(policy).resolve(policy.document)
    cfn = cast(iam.CfnPolicy, policy.node.default_child)
    cfn.policy_document = {**document, "Statement": rewrite(document["Statement"])}
    return cfn

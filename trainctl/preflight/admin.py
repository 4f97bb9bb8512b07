"""admin: each cluster.admin_principals entry exists, since EKS refuses an access entry for a missing one
(sts:GetCallerIdentity, iam:GetRole, iam:GetUser)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.spec import Environment
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
)

_PRINCIPAL = re.compile(r"^arn:[^:]+:iam::(?P<account>\d{12}):(?P<kind>role|user)/(?:[^/]+/)*(?P<name>[^/]+)$")


@dataclass(frozen=True)
class AdminPrincipal:
    given: str
    kind: str
    """"role" or "user"."""
    name: str
    account: str | None
    """The ARN's account; None for a bare role name, which resolves in the deploying account."""


def parse_principal(text: str) -> AdminPrincipal:
    """An entry of cluster.admin_principals (ClusterConfig validated its shape): a role name or an ARN."""
    match = _PRINCIPAL.match(text)
    if match is None:
        return AdminPrincipal(given=text, kind="role", name=text, account=None)
    return AdminPrincipal(given=text, kind=match["kind"], name=match["name"], account=match["account"])


def evaluate_admin(principal: AdminPrincipal, found: Mapping[str, Any] | None, *, caller_account: str) -> CheckResult:
    """EKS refuses an access entry whose principal does not exist ("The specified principalArn is invalid"),
    which fails the cluster stack's create and rolls it back (CreateAccessEntry's answer, seen on deploys)."""
    subject = principal.given
    field_fix = "or change cluster.admin_principals in infra/spec/environments.py"
    if principal.account is not None and principal.account != caller_account:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.WARN,
            f"{principal.kind} {principal.name} is in account {principal.account}, the credentials are account "
            f"{caller_account}'s: not looked up",
            f"run preflight with credentials of account {principal.account}, or check it there: "
            f"aws iam get-{principal.kind} --{principal.kind}-name {principal.name}",
        )
    where = f"account {caller_account}"
    if found is None:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.FAIL,
            f"no IAM {principal.kind} named {principal.name} in {where}: EKS rejects its access entry "
            '("The specified principalArn is invalid") and the cluster\'s stack rolls back',
            f"create the {principal.kind} in {where} (aws iam create-{principal.kind} "
            f"--{principal.kind}-name {principal.name} ...), {field_fix}",
        )
    arn = str(found.get("Arn", ""))
    if principal.account is not None and arn != principal.given:
        return CheckResult(
            Check.ADMIN,
            subject,
            Status.FAIL,
            f"nothing at that ARN: the {principal.kind} named {principal.name} in {where} is {arn} (another path)",
            f"write the ARN exactly as IAM reports it ({arn}), {field_fix}",
        )
    return CheckResult(Check.ADMIN, subject, Status.PASS, f"{principal.kind} exists: {arn}")


def admin_checks(env: Environment, aws: Aws, *, region: str) -> list[CheckResult]:
    principals = [parse_principal(p) for p in env.cluster.admin_principals]
    results: list[CheckResult] = []
    account: list[str] = []

    for principal in principals:

        def one(principal: AdminPrincipal = principal) -> list[CheckResult]:
            if not account:
                account.append(aws.caller_account())
            if principal.account is not None and principal.account != account[0]:
                return [evaluate_admin(principal, None, caller_account=account[0])]
            lookup = aws.iam_role if principal.kind == "role" else aws.iam_user
            return [evaluate_admin(principal, lookup(principal.name), caller_account=account[0])]

        results += attempt(Check.ADMIN, [principal.given], region, one)
    return results


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    say("admin principals")
    return admin_checks(env, aws, region=aws.region)

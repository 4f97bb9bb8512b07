"""The check results every preflight check returns: the check names, the status of a row, the API it
asked, and the could-not-run row an AWS failure becomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from infra.spec import GpuNodeGroupConfig
from trainctl.aws import AwsError, ErrorKind
from trainctl.output import NOT_RUN

# infra/stage.py tags every resource of an environment's stack with this key and the environment's name.
ENVIRONMENT_TAG = "platform:environment"
# CloudFormation tags what a stack creates with the stack's name (infra/stage.py: <cluster>-platform).
STACK_NAME_TAG = "aws:cloudformation:stack-name"

# What a check reports its progress to (a line per lookup; trainctl/commands/preflight.py shows it on a terminal).
Say = Callable[[str], None]


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    NOT_RUN = NOT_RUN


class Check(StrEnum):
    OFFERING = "offering"
    INSTANCE = "instance"
    QUOTA = "quota"
    CAPACITY = "capacity"
    KUBERNETES = "kubernetes"
    ADDON = "add-on"
    SUBNET = "subnet"
    PLACEMENT = "placement"
    ADMIN = "admin"
    CHART = "chart"
    LEFTOVER = "leftover"
    SCALED = "scaled"


API: Mapping[Check, str] = {
    Check.OFFERING: "ec2:DescribeInstanceTypeOfferings",
    Check.INSTANCE: "ec2:DescribeInstanceTypes",
    Check.QUOTA: "servicequotas:GetServiceQuota",
    Check.CAPACITY: "ec2:DescribeCapacityReservations",
    Check.KUBERNETES: "eks:DescribeClusterVersions",
    Check.ADDON: "eks:DescribeAddonVersions",
    Check.SUBNET: "ec2:DescribeVpcs, ec2:DescribeSubnets, ec2:DescribeInstances",
    Check.PLACEMENT: "ec2:DescribeCapacityReservations",
    Check.ADMIN: "sts:GetCallerIdentity, iam:GetRole, iam:GetUser",
    Check.CHART: "HTTP GET <repository>/index.yaml; oci:// charts: HEAD /v2/<chart>/manifests/<version>",
    Check.LEFTOVER: "cloudformation:ListStackResources, eks:DescribeCluster, eks:DescribeNodegroup, "
    "logs:DescribeLogGroups, fsx:DescribeFileSystems",
    Check.SCALED: "eks:DescribeNodegroup",
}


@dataclass(frozen=True)
class CheckResult:
    check: Check
    subject: str
    status: Status
    reason: str
    fix: str | None = None
    error_kind: str | None = None
    """Set (a trainctl.aws.ErrorKind, or a trainctl.helm_repo.RepoErrorKind for the chart check) when the
    check could not run; its status is then NOT_RUN."""

    @property
    def ran(self) -> bool:
        return self.error_kind is None

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check.value,
            "subject": self.subject,
            "status": self.status.value,
            "reason": self.reason,
            "fix": self.fix,
            "api": API[self.check],
            "ran": self.ran,
            "error_kind": self.error_kind,
        }


def aws_fix(error: AwsError, region: str, *, actions: str | None = None) -> str:
    """What the operator does about a failed AWS call; `actions`: the IAM actions to allow when access is denied
    (default: the call's own)."""
    fixes = {
        ErrorKind.NO_CREDENTIALS: "configure credentials (aws configure, aws sso login, AWS_PROFILE or --profile) "
        "and run again",
        ErrorKind.INVALID_CREDENTIALS: "refresh the credentials (an expired session?) and run again",
        ErrorKind.UNREACHABLE: f"check network access to the AWS endpoints of {region} (proxy, VPN, region name)",
        ErrorKind.ACCESS_DENIED: f"allow {actions or error.api} (read-only) for the caller, or run as a role that "
        "has it",
        ErrorKind.UNSUPPORTED: "upgrade boto3 and botocore; the installed version lacks this API",
    }
    return fixes.get(error.kind, "run again; if it persists, look the error code up")


def could_not_run(check: Check, subject: str, error: AwsError, region: str) -> CheckResult:
    return CheckResult(
        check,
        subject,
        Status.NOT_RUN,
        f"could not run: {error.api}: {error}",
        aws_fix(error, region),
        error.kind.value,
    )


def group_subject(group: GpuNodeGroupConfig) -> str:
    return f"{group.name} ({group.instance_type})"


def date_text(value: object) -> str:
    return value.date().isoformat() if isinstance(value, datetime) else str(value)


def attempt(
    check: Check, subjects: Sequence[str], region: str, action: Callable[[], list[CheckResult]]
) -> list[CheckResult]:
    """Run one check's calls; if they fail, one could-not-run row per subject."""
    try:
        return action()
    except AwsError as exc:
        return [could_not_run(check, subject, exc, region) for subject in subjects]

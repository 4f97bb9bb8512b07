"""kubernetes: EKS offers KUBERNETES_VERSION in the region (eks:DescribeClusterVersions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.spec import Environment
from infra.spec.versions import KUBERNETES_VERSION
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    date_text,
)


def evaluate_kubernetes(version: str, entries: Sequence[Mapping[str, Any]], region: str) -> CheckResult:
    subject = f"Kubernetes {version}"
    fix_version = (
        f"set KUBERNETES_VERSION in infra/spec/versions.py to a version EKS offers "
        f"(aws eks describe-cluster-versions --region {region}), with the matching kubectl layer"
    )
    entry = next((e for e in entries if e.get("clusterVersion") == version), None)
    if entry is None:
        return CheckResult(
            Check.KUBERNETES, subject, Status.FAIL, f"EKS in {region} does not offer Kubernetes {version}", fix_version
        )
    status = str(entry.get("versionStatus") or entry.get("status") or "").upper().replace("-", "_")
    standard_end = entry.get("endOfStandardSupportDate")
    extended_end = entry.get("endOfExtendedSupportDate")
    if status == "STANDARD_SUPPORT":
        until = f" until {date_text(standard_end)}" if standard_end is not None else ""
        return CheckResult(Check.KUBERNETES, subject, Status.PASS, f"in standard support{until}")
    if status == "EXTENDED_SUPPORT":
        until = f" until {date_text(extended_end)}" if extended_end is not None else ""
        return CheckResult(
            Check.KUBERNETES,
            subject,
            Status.WARN,
            f"in extended support{until} (charged extra per cluster hour)",
            "plan the upgrade: " + fix_version,
        )
    return CheckResult(
        Check.KUBERNETES,
        subject,
        Status.FAIL,
        f"EKS reports it {status.lower().replace('_', ' ') or 'with no support status'}",
        fix_version,
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    say(f"EKS support of Kubernetes {KUBERNETES_VERSION}")

    def kubernetes() -> list[CheckResult]:
        return [evaluate_kubernetes(KUBERNETES_VERSION, aws.cluster_versions(KUBERNETES_VERSION), aws.region)]

    return attempt(Check.KUBERNETES, [f"Kubernetes {KUBERNETES_VERSION}"], aws.region, kubernetes)

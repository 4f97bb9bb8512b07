"""add-on: EKS offers each pinned managed add-on version the environment installs for KUBERNETES_VERSION
(eks:DescribeAddonVersions)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from infra.spec import Environment
from infra.spec.versions import CORE_ADDONS, KUBERNETES_VERSION, MANAGED_ADDONS
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
)

# Managed add-ons outside CORE_ADDONS, and whether an environment installs them (infra/addons/).
OPTIONAL_ADDONS: Mapping[str, Callable[[Environment], bool]] = {
    "aws-fsx-csi-driver": lambda env: env.add_ons.checkpoint_storage is not None,
    "eks-node-monitoring-agent": lambda env: env.add_ons.node_monitoring_agent,
}


def environment_addons(env: Environment) -> list[str]:
    """The managed add-ons the environment installs, in MANAGED_ADDONS order."""
    return [
        name
        for name in MANAGED_ADDONS
        if name in CORE_ADDONS or name not in OPTIONAL_ADDONS or OPTIONAL_ADDONS[name](env)
    ]


def evaluate_addon(name: str, pinned: str, kubernetes_version: str, offered: Sequence[str]) -> CheckResult:
    subject = f"{name} {pinned}"
    if pinned in offered:
        return CheckResult(Check.ADDON, subject, Status.PASS, f"offered for Kubernetes {kubernetes_version}")
    fix = (
        f"pin an offered version in MANAGED_ADDONS (infra/spec/versions.py): aws eks describe-addon-versions "
        f"--kubernetes-version {kubernetes_version} --addon-name {name}"
    )
    if not offered:
        return CheckResult(
            Check.ADDON, subject, Status.FAIL, f"EKS offers no {name} version for Kubernetes {kubernetes_version}", fix
        )
    shown = ", ".join(offered[:3]) + (", ..." if len(offered) > 3 else "")
    return CheckResult(
        Check.ADDON,
        subject,
        Status.FAIL,
        f"not offered for Kubernetes {kubernetes_version} (offered: {shown})",
        fix,
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    results: list[CheckResult] = []
    for name in environment_addons(env):
        pinned = MANAGED_ADDONS[name]
        say(f"add-on {name} {pinned}")

        def addon(name: str = name, pinned: str = pinned) -> list[CheckResult]:
            offered = aws.addon_versions(name, KUBERNETES_VERSION)
            return [evaluate_addon(name, pinned, KUBERNETES_VERSION, offered)]

        results += attempt(Check.ADDON, [f"{name} {pinned}"], aws.region, addon)
    return results

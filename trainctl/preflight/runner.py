"""Run every check of an environment: the checks are a tuple; each is `gather(env, aws, say) -> rows`.

Adding a check is one module with a `gather` and one entry in `checks()`; the order of that tuple is
the order of the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from infra.spec import ConfigError, Environment, get_environment
from trainctl.aws import Aws
from trainctl.helm_repo import DEFAULT_TIMEOUT as CHART_TIMEOUT
from trainctl.preflight import addons, admin, capacity, instance, kubernetes, leftover, offering, quota, subnet
from trainctl.preflight.chart import ChartSources
from trainctl.preflight.report import PreflightReport
from trainctl.preflight.results import CheckResult, Say

Gather = Callable[[Environment, Aws, Say], list[CheckResult]]
Progress = Say


def checks(charts: ChartSources) -> tuple[Gather, ...]:
    """The checks in the order of their rows (`charts`: where the chart check asks)."""
    return (
        offering.gather,
        instance.gather,
        quota.gather,
        capacity.gather,  # and placement, beside each group's capacity row
        kubernetes.gather,
        addons.gather,
        subnet.gather,
        admin.gather,
        charts.gather,
        leftover.gather,
    )


def run_checks(
    env: Environment,
    aws: Aws,
    *,
    chart_repositories: Mapping[str, str] | None = None,
    chart_timeout: float = CHART_TIMEOUT,
    progress: Progress | None = None,
) -> list[CheckResult]:
    """Every check of the environment against `aws.region`; never raises for an AWS or HTTP failure.

    `chart_repositories`: a HELM_CHARTS key (or "*" for all) -> a repository URL to ask instead of the
    pinned one (a mirror, or a test's server)."""

    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    results: list[CheckResult] = []
    for gather in checks(ChartSources(chart_repositories or {}, chart_timeout)):
        results += gather(env, aws, say)
    return results


def preflight(
    env_name: str,
    *,
    region: str | None = None,
    profile: str | None = None,
    endpoint_urls: Mapping[str, str] | None = None,
    chart_repositories: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> PreflightReport:
    try:
        env = get_environment(env_name)
    except ConfigError as exc:
        report = PreflightReport(env_name, region, None)
        report.errors.append(
            f"unknown environment {env_name!r}; known: {exc.allowed} (declared in infra/spec/environments.py)"
        )
        return report
    chosen = region or env.region
    report = PreflightReport(env.name, chosen, env.region)
    if chosen != env.region:
        report.warnings.append(
            f"--region {chosen} differs from environment {env.name}'s region {env.region}: its zone names "
            f"({', '.join(env.network.availability_zones)}) and cdk deploy use {env.region}"
        )
    aws = Aws(region=chosen, profile=profile, endpoint_urls=endpoint_urls)
    report.results = run_checks(env, aws, chart_repositories=chart_repositories, progress=progress)
    return report

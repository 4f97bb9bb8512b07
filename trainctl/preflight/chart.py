"""chart: each pinned Helm chart version (infra/spec/versions.py HELM_CHARTS) is listed in its repository's
index, or (an oci:// chart) its tag exists in the registry (HTTP GET <repository>/index.yaml; HEAD
/v2/<chart>/manifests/<version>). Charts are not asked of AWS: `ChartSources` says where to ask."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from infra.spec import Environment
from infra.spec.versions import HELM_CHARTS, HelmChartPin
from trainctl.aws import Aws
from trainctl.helm_repo import DEFAULT_TIMEOUT as CHART_TIMEOUT
from trainctl.helm_repo import ChartIndex, ChartRepoError, RepoErrorKind, check_oci_chart, fetch_index, is_oci, newest
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
)

# --chart-repository without a pin name: every pinned chart is fetched from that URL.
ALL_CHARTS = "*"


def _chart_subject(pin: HelmChartPin) -> str:
    return f"{pin.chart} {pin.version}"


def evaluate_chart(name: str, pin: HelmChartPin, index: ChartIndex) -> CheckResult:
    """The exact pinned string must be listed. Helm itself resolves `--version` by exact string first,
    then as a semver constraint (helm/helm pkg/repo/index.go, IndexFile.Get), so "0.5.32" would still
    install "v0.5.32"; such a near miss is a WARN that says so, not a PASS."""
    subject = _chart_subject(pin)
    pin_fix = f"pin a listed version of {name} in HELM_CHARTS (infra/spec/versions.py)"
    versions = index.versions(pin.chart)
    if versions is None:
        return CheckResult(
            Check.CHART,
            subject,
            Status.FAIL,
            f"{index.url} has no chart named {pin.chart} ({len(index.entries)} charts listed)",
            f"correct chart or repository of {name} in HELM_CHARTS (infra/spec/versions.py)",
        )
    if pin.version in versions:
        return CheckResult(Check.CHART, subject, Status.PASS, f"listed in {index.url}")
    shown = ", ".join(newest(versions)) or "none"
    other = pin.version[1:] if pin.version.startswith("v") else f"v{pin.version}"
    if other in versions:
        return CheckResult(
            Check.CHART,
            subject,
            Status.WARN,
            f"{pin.version!r} is not listed, {other!r} is (Helm's semver match would install it); newest: {shown}",
            f"pin the exact string {other!r} for {name} in HELM_CHARTS (infra/spec/versions.py)",
        )
    return CheckResult(
        Check.CHART,
        subject,
        Status.FAIL,
        f"version {pin.version!r} is not in {index.url}: the Helm install fails inside CloudFormation and "
        f"rolls the stack back; newest listed: {shown}",
        pin_fix,
    )


def chart_not_fetched(pin: HelmChartPin, error: ChartRepoError) -> CheckResult:
    """A 404 is the repository's answer (no index at that URL: Helm fails the same way); anything else
    leaves the check without a verdict."""
    subject = _chart_subject(pin)
    if error.kind is RepoErrorKind.NOT_FOUND:
        return CheckResult(
            Check.CHART,
            subject,
            Status.FAIL,
            f"no Helm repository index: {error}",
            f"correct the repository of {pin.chart} in HELM_CHARTS (infra/spec/versions.py)",
        )
    fixes = {
        RepoErrorKind.UNREACHABLE: f"check network access to {error.url} (proxy, firewall) and run again",
        RepoErrorKind.HTTP_ERROR: "run again later; if it persists, open the URL in a browser",
        RepoErrorKind.MALFORMED: f"open {error.url}: a proxy or login page may be answering instead of the repository",
        RepoErrorKind.TOO_LARGE: "run again with a larger cap, or check the URL names a chart repository",
    }
    reason = f"could not run: {error}"
    return CheckResult(Check.CHART, subject, Status.NOT_RUN, reason, fixes[error.kind], error.kind.value)


def oci_chart_check(name: str, pin: HelmChartPin, repository: str, *, timeout: float) -> CheckResult:
    """A chart published only to an OCI registry (no index.yaml): the pinned version's tag must exist."""
    subject = _chart_subject(pin)
    try:
        digest = check_oci_chart(repository, pin.version, timeout=timeout)
    except ChartRepoError as error:
        if error.kind is RepoErrorKind.NOT_FOUND:
            return CheckResult(
                Check.CHART,
                subject,
                Status.FAIL,
                f"version {pin.version!r} is not published in {repository}: the Helm install fails inside "
                f"CloudFormation and rolls the stack back ({error})",
                f"pin a published version of {name} in HELM_CHARTS (infra/spec/versions.py)",
            )
        return chart_not_fetched(pin, error)
    return CheckResult(Check.CHART, subject, Status.PASS, f"published in {repository} as {digest}")


def chart_checks(overrides: Mapping[str, str], *, timeout: float, say: Callable[[str], None]) -> list[CheckResult]:
    """`overrides`: pin name (a HELM_CHARTS key) or "*" -> the repository URL to ask instead
    (an oci:// chart reference is asked through the registry API)."""
    results: list[CheckResult] = []
    fetched: dict[str, ChartIndex | ChartRepoError] = {}
    for name, pin in HELM_CHARTS.items():
        repository = overrides.get(name) or overrides.get(ALL_CHARTS) or pin.repository
        if is_oci(repository):
            say(f"chart registry {repository}")
            results.append(oci_chart_check(name, pin, repository, timeout=timeout))
            continue
        if repository not in fetched:
            say(f"chart repository {repository}")
            try:
                fetched[repository] = fetch_index(repository, timeout=timeout)
            except ChartRepoError as exc:
                fetched[repository] = exc
        answer = fetched[repository]
        if isinstance(answer, ChartRepoError):
            results.append(chart_not_fetched(pin, answer))
        else:
            results.append(evaluate_chart(name, pin, answer))
    return results


@dataclass(frozen=True)
class ChartSources:
    """Where to ask for the pinned charts: `overrides` maps a HELM_CHARTS key (or "*" for all) to a
    repository URL to ask instead of the pinned one (a mirror, or a test's server)."""

    overrides: Mapping[str, str] = field(default_factory=dict)
    timeout: float = CHART_TIMEOUT

    def gather(self, env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
        return chart_checks(self.overrides, timeout=self.timeout, say=say)

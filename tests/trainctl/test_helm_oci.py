"""Pinned charts published only as OCI artifacts (Kueue): the preflight chart check asks the registry
for the pinned tag through the OCI distribution API (tests/trainctl/fake_registry.py on loopback)."""

from __future__ import annotations

import json
import socket

import pytest

from infra.spec.versions import HELM_CHARTS
from tests.trainctl.fake_registry import FakeRegistry, Image
from trainctl.helm_repo import ChartRepoError, RepoErrorKind, oci_reference
from trainctl.preflight.chart import chart_checks
from trainctl.preflight.results import Check, Status

KUEUE_PIN = HELM_CHARTS["kueue"]


def _chart_manifest(version: str) -> Image:
    """What `helm push` stores: an OCI image manifest whose config is the Helm chart config."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json", "digest": "sha256:" + "0" * 64, "size": 1},
        "layers": [
            {
                "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                "digest": "sha256:" + "1" * 64,
                "size": 2,
                "annotations": {"org.opencontainers.image.version": version},
            }
        ],
    }
    return Image(manifest=json.dumps(manifest).encode(), index=None)


def _rows(repository: str) -> dict[str, object]:
    results = chart_checks({"kueue": repository}, timeout=5, say=lambda _: None)
    (row,) = [r for r in results if r.subject.startswith("kueue ")]
    return {
        "status": row.status,
        "reason": row.reason,
        "fix": row.fix,
        "check": row.check,
        "ran": row.ran,
        "error_kind": row.error_kind,
    }


def test_the_kueue_pin_is_an_oci_repository() -> None:
    assert KUEUE_PIN.repository.startswith("oci://")
    assert (
        oci_reference(KUEUE_PIN.repository, KUEUE_PIN.version)
        == f"registry.k8s.io/kueue/charts/kueue:{KUEUE_PIN.version}"
    )


def test_oci_reference_maps_helm_build_metadata_and_refuses_non_oci() -> None:
    # Helm stores "+" of a chart version as "_" in the OCI tag (tags cannot hold "+").
    assert oci_reference("oci://example.invalid/charts/x", "1.2.3+build.4") == "example.invalid/charts/x:1.2.3_build.4"
    with pytest.raises(ChartRepoError, match=r"'https://example.invalid/x' is not an oci:// chart reference") as info:
        oci_reference("https://example.invalid/x", "1.0.0")
    assert info.value.kind is RepoErrorKind.MALFORMED


def test_a_published_oci_chart_version_passes(registry: FakeRegistry) -> None:
    registry.push("kueue/charts/kueue", KUEUE_PIN.version, _chart_manifest(KUEUE_PIN.version))
    repository = f"oci://{registry.host}/kueue/charts/kueue"
    row = _rows(repository)
    assert row["check"] is Check.CHART
    assert row["status"] is Status.PASS, row
    assert str(row["reason"]).startswith(f"published in {repository} as sha256:")
    assert [s.path for s in registry.requests("/v2/")] == [f"/v2/kueue/charts/kueue/manifests/{KUEUE_PIN.version}"]


def test_an_unpublished_oci_chart_version_fails_naming_the_fix(registry: FakeRegistry) -> None:
    registry.push("kueue/charts/kueue", "0.18.0", _chart_manifest("0.18.0"))
    repository = f"oci://{registry.host}/kueue/charts/kueue"
    row = _rows(repository)
    assert (row["status"], row["ran"]) == (Status.FAIL, True)
    assert str(row["reason"]).startswith(
        f"version {KUEUE_PIN.version!r} is not published in {repository}: the Helm install fails inside "
        "CloudFormation and rolls the stack back ("
    )
    assert row["fix"] == "pin a published version of kueue in HELM_CHARTS (infra/spec/versions.py)"


def test_an_unreachable_oci_registry_is_a_check_that_could_not_run() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    row = _rows(f"oci://127.0.0.1:{port}/kueue/charts/kueue")
    assert row["status"] is not Status.PASS
    assert str(row["reason"]).startswith("could not run: ")
    assert row["ran"] is False
    assert row["error_kind"] == RepoErrorKind.UNREACHABLE.value

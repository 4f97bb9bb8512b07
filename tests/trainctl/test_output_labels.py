"""A check that could not run is labelled NOT RUN in every trainctl table, never FAIL (issue 16):
a FAIL row means "fix this before deploying", a NOT RUN row means "no verdict: fix access and rerun"."""

from __future__ import annotations

from pathlib import Path

from infra.spec.versions import HELM_CHARTS
from trainctl.aws import AwsError, ErrorKind
from trainctl.capacity import Zone
from trainctl.capacity_probe import Probe, Verdict
from trainctl.helm_repo import ChartRepoError, RepoErrorKind
from trainctl.output import NOT_RUN, table
from trainctl.pin import ImageResult, Mode, PinReport
from trainctl.pin import Status as PinStatus
from trainctl.preflight.chart import chart_not_fetched
from trainctl.preflight.report import PreflightReport
from trainctl.preflight.results import Check, CheckResult, Status, could_not_run


def _rows(rendered: str, header: str) -> dict[str, str]:
    """First cell -> the whole line, for the table under `header`."""
    lines = rendered.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows[line.split("  ")[0]] = line
    return rows


def test_preflight_row_that_could_not_run_is_not_a_fail() -> None:
    denied = AwsError(ErrorKind.ACCESS_DENIED, "servicequotas:GetServiceQuota", "AccessDeniedException: no")
    report = PreflightReport(environment="prod", region="us-east-2", environment_region="us-east-2")
    report.results = [
        CheckResult(Check.OFFERING, "p5 (p5.48xlarge)", Status.PASS, "offered in us-east-2a"),
        CheckResult(Check.INSTANCE, "g6 (g6.12xlarge)", Status.FAIL, "EC2 reports 2 GPU(s)", "correct the facts"),
        could_not_run(Check.QUOTA, "p5 (p5.48xlarge)", denied, "us-east-2"),
    ]
    out, _ = report.render()
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert [row[0] for row in rows] == ["offering", "instance", "quota"]
    quota = out.splitlines()[3]
    assert f"  {NOT_RUN}  could not run: servicequotas:GetServiceQuota" in quota
    assert " FAIL " not in quota
    assert " FAIL " in out.splitlines()[2]
    document = report.to_json()
    assert [c["status"] for c in document["checks"]] == ["PASS", "FAIL", NOT_RUN]
    assert document["counts"] == {"PASS": 1, "WARN": 0, "FAIL": 1, "could_not_run": 1}
    assert report.summary().startswith("preflight failed for environment prod in us-east-2: 1 PASS, 0 WARN, 1 FAIL")
    assert report.summary().endswith("; 1 could not run. Fix them before cdk deploy")
    # The fixes list names the row by its label too.
    assert any(line.startswith(f"{NOT_RUN} quota p5 (p5.48xlarge): allow servicequotas") for line in report.fixes())


def test_preflight_chart_index_unreachable_is_not_run_but_missing_index_fails() -> None:
    pin = HELM_CHARTS["kuberay-operator"]
    dead = chart_not_fetched(pin, ChartRepoError(RepoErrorKind.UNREACHABLE, "http://127.0.0.1:9/index.yaml", "refused"))
    gone = chart_not_fetched(pin, ChartRepoError(RepoErrorKind.NOT_FOUND, "http://127.0.0.1:9/index.yaml", "404"))
    assert (dead.status, dead.ran) == (Status.NOT_RUN, False)
    assert (gone.status, gone.ran) == (Status.FAIL, True)


def test_pin_image_that_could_not_be_resolved_is_labelled_not_run(tmp_path: Path) -> None:
    report = PinReport(mode=Mode.CHECK, lock=tmp_path / "images.lock.json")
    report.images = [
        ImageResult("ray-train", "r/ray:1", PinStatus.OK, "sha256:" + "a" * 64, "sha256:" + "a" * 64),
        ImageResult("nvrx", "r/nvrx:1", PinStatus.STALE, "sha256:" + "b" * 64, "sha256:" + "c" * 64),
        ImageResult("gone", "r/gone:1", PinStatus.ERROR, None, None, error_kind="network", error="refused"),
    ]
    out, err = report.render()
    rows = _rows(out, "NAME")
    assert rows["gone"].split()[1:3] == NOT_RUN.split()
    assert rows["nvrx"].split()[1] == "stale"
    assert report.to_json()["images"][2]["status"] == "error"  # machines keep the enum value
    assert "error: gone: refused" in err


def test_capacity_columns_that_could_not_be_read_say_so() -> None:
    unread = Zone(region="us-east-2", name="us-east-2b", offered=True, subnet="planned", subnet_ok=True)
    no = Zone(region="us-east-2", name="us-east-2c", offered=False, quota=100, used_vcpus=0)
    assert unread.verdict is Verdict.UNKNOWN
    row = unread.row()
    assert row[3] == "not read"  # quota headroom: the quota or the running vCPUs could not be read
    assert row[-1] == "unknown"
    assert no.row()[2] == "no"
    probe = Zone(region="us-east-2", name="us-east-2a", probe=Probe(zone="us-east-2a", region="us-east-2"))
    assert probe.row()[2] == "not read"


def test_table_keeps_columns_aligned_with_multiword_labels() -> None:
    out = table(["A", "STATUS", "B"], [["x", NOT_RUN, "y"], ["long-name", "FAIL", "z"]])
    first, second, third = out.splitlines()
    assert first.index("STATUS") == second.index(NOT_RUN) == third.index("FAIL")

"""`trainctl plan`: the current synth against a template snapshot, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import of_type, only
from trainctl.cli import main
from trainctl.commands.plan import snapshot_path


def test_the_committed_snapshot_plans_no_replacement(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--env", "dev"]) == 0
    out = capsys.readouterr().out
    assert "no resource is replaced" in out


def test_a_stateful_and_an_impossible_replacement_fail_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As if the last deploy had the file system in another subnet and the g6 group on a Capacity Block under
    today's name: the file system is replaced (stateful, not acknowledged) and the node group cannot be."""
    before = json.loads(snapshot_path("dev").read_text())
    _, fs = only(before["Storage"], "AWS::FSx::FileSystem")
    fs["Properties"]["SubnetIds"] = ["subnet-0123456789abcdef0"]
    (ng,) = of_type(before["Gpu-g6"], "AWS::EKS::Nodegroup").values()
    ng["Properties"]["CapacityType"] = "CAPACITY_BLOCK"
    snapshot = tmp_path / "before.json"
    snapshot.write_text(json.dumps(before))
    assert main(["plan", "--env", "dev", "--snapshot", str(snapshot), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_type = {r["type"]: r for r in report["replacements"]}
    assert by_type["AWS::FSx::FileSystem"]["stateful"] is True
    assert by_type["AWS::FSx::FileSystem"]["properties"] == ["SubnetIds"]
    assert by_type["AWS::FSx::FileSystem"]["acknowledged"] is None
    nodegroup = by_type["AWS::EKS::Nodegroup"]
    assert nodegroup["properties"] == ["CapacityType"]
    assert "custom-named resource requires replacing" in nodegroup["blocked"]
    assert len(report["failures"]) == 2


def test_an_unreadable_snapshot_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--env", "dev", "--snapshot", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the template snapshot" in capsys.readouterr().err

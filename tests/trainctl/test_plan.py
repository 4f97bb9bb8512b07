"""`trainctl plan`: the current synth against the deployed templates (or a snapshot), through the real CLI.

CloudFormation is FakeCloudFormation (tests/trainctl/fake_aws.py says why not moto). Only the zone-move test
synthesizes here; the others take the session's synth (tests/conftest.py `assembly`) in place of the command's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.spec import Environment, get_environment
from tests.conftest import StackArtifact
from tests.helpers import of_type, only
from tests.trainctl.fake_aws import FakeCloudFormation
from trainctl.cli import main
from trainctl.commands import plan as plan_command
from trainctl.commands.plan import Synth, snapshot_path
from trainctl.template_plan import masked

pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

Assembly = dict[str, dict[str, StackArtifact]]


@pytest.fixture
def session_synth(assembly: Assembly, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's synth is the session's (the same app, the same cdk.json flags)."""

    def synthesize(environment: Environment) -> Synth:
        stacks = assembly[environment.name].values()
        return Synth(templates={s.id: masked(s.template) for s in stacks}, names={s.id: s.name for s in stacks})

    monkeypatch.setattr(plan_command, "synthesize", synthesize)


@pytest.fixture
def cloudformation() -> Iterator[Callable[..., FakeCloudFormation]]:
    made: list[FakeCloudFormation] = []

    def start(**kwargs: Any) -> FakeCloudFormation:
        made.append(FakeCloudFormation({}, **kwargs).start())  # type: ignore[arg-type]
        return made[-1]

    yield start
    for stub in made:
        stub.stop()


def deployed(assembly: Assembly, env: str) -> dict[str, dict[str, Any]]:
    """Stack name -> the template CloudFormation holds: the current synth, deployed (asset hashes unmasked)."""
    return {s.name: s.template for s in assembly[env].values()}


def test_a_zone_move_on_a_deployed_environment_is_named_before_the_deploy(
    assembly: Assembly,
    cloudformation: Callable[..., FakeCloudFormation],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """prod is deployed as the code stands; its GPU zone is then changed in a copy of the spec. The committed snapshot
    still equals the deployed templates, so only the deployed stacks can show what the deploy would replace."""
    prod = get_environment("prod")
    moved = dataclasses.replace(prod, gpu_availability_zone="us-east-2b")
    monkeypatch.setattr(plan_command, "get_environment", lambda name: moved)
    stub = cloudformation(templates=deployed(assembly, "prod"))
    assert main(["plan", "--env", "prod", "--endpoint-url", f"cloudformation={stub.url}", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["against"] == "deployed"
    assert {s["status"] for s in report["stacks"].values()} == {"UPDATE_COMPLETE"}
    replaced = {(r["stack"], r["type"]) for r in report["replacements"] if r["acknowledged"] is None}
    assert ("Storage", "AWS::FSx::FileSystem") in replaced
    assert ("Gpu-p5", "AWS::EKS::Nodegroup") in replaced
    assert ("Gpu-g6", "AWS::EKS::Nodegroup") in replaced
    assert sorted(c.split()[0] for c in stub.calls) == ["DescribeStacks"] * 5 + ["GetTemplate"] * 5


def test_nothing_deployed_plans_every_stack_as_new(
    session_synth: None, cloudformation: Callable[..., FakeCloudFormation], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = cloudformation()
    assert main(["plan", "--env", "dev", "--endpoint-url", f"cloudformation={stub.url}"]) == 0
    out = capsys.readouterr().out
    assert "against the templates deployed in us-west-2" in out
    for name in ("ml-dev-images", "ml-dev-platform", "ml-dev-storage", "ml-dev-gpu-g6"):
        assert re.search(rf"{name} +new", out)
    assert "no resource is replaced" in out


def test_snapshot_compares_with_the_committed_snapshot_and_calls_no_aws(
    session_synth: None, cloudformation: Callable[..., FakeCloudFormation], capsys: pytest.CaptureFixture[str]
) -> None:
    stub = cloudformation(denied=True)
    assert main(["plan", "--env", "dev", "--snapshot", "--endpoint-url", f"cloudformation={stub.url}"]) == 0
    out = capsys.readouterr().out
    assert f"against the template snapshot {snapshot_path('dev')}" in out
    assert "no resource is replaced" in out
    assert stub.calls == []


def test_a_stateful_and_an_impossible_replacement_fail_the_plan(
    tmp_path: Path, session_synth: None, capsys: pytest.CaptureFixture[str]
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
    assert report["against"] == "snapshot"
    assert report["snapshot"] == str(snapshot)
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


@pytest.mark.parametrize("cause", ["access denied", "no credentials"])
def test_an_aws_error_cannot_run_and_names_the_call_and_the_fix(
    cause: str,
    session_synth: None,
    cloudformation: Callable[..., FakeCloudFormation],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub = cloudformation(denied=True)
    if cause == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert main(["plan", "--env", "dev", "--endpoint-url", f"cloudformation={stub.url}"]) == 2
    err = capsys.readouterr().err
    assert "cloudformation:DescribeStacks" in err
    if cause == "access denied":
        assert stub.calls == ["DescribeStacks ml-dev-images"]
        assert "allow cloudformation:DescribeStacks and cloudformation:GetTemplate" in err
    else:
        assert stub.calls == []
        assert "configure credentials" in err
    assert "--snapshot" in err

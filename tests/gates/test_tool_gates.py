"""cfn-lint, checkov and cdk-nag gates: the real output passes, a broken input fails by name."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam

from gates.cfn_lint import run_cfn_lint
from gates.checkov_gate import run_checkov
from gates.nag import run_nag
from gates.nag_acknowledgments import ACKNOWLEDGMENTS, Acknowledgment
from gates.report import GateError
from tests.conftest import cdk_json_context

# cfn-lint


@pytest.mark.slow
def test_cfn_lint_reports_a_broken_template(tmp_path: Path) -> None:
    template = {
        "Resources": {
            "Bucket": {"Type": "AWS::S3::Bucket", "Properties": {"BucketNam": "typo"}},
        }
    }
    path = tmp_path / "broken.template.json"
    path.write_text(json.dumps(template))
    findings = run_cfn_lint([path])
    assert any("E3002" in f.message and "BucketNam" in f.message for f in findings), findings


# checkov


@pytest.mark.slow
def test_checkov_reports_a_privileged_container(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(
        """
apiVersion: v1
kind: Pod
metadata: {name: bad, namespace: training}
spec:
  containers:
  - name: c
    image: public.ecr.aws/x/y@sha256:%s
    securityContext: {privileged: true}
"""
        % ("ab" * 32)
    )
    _, findings = run_checkov(tmp_path)
    ids = {f.message.split(":")[0] for f in findings}
    assert "CKV_K8S_16" in ids  # Container should not be privileged
    assert all("Pod.training.bad" in f.where or "bad" in f.where for f in findings)


def test_checkov_config_lists_a_reason_for_every_skip() -> None:
    import yaml

    from gates.checkov_gate import CONFIG

    text = CONFIG.read_text()
    skipped = yaml.safe_load(text).get("skip-check") or []
    for check in skipped:
        line = next(line for line in text.splitlines() if check in line)
        assert "#" in line, f"{check} is skipped without a reason"


# cdk-nag


def _factory_with_managed_policy(outdir: str) -> tuple[cdk.App, list[cdk.Stack]]:
    app = cdk.App(outdir=outdir, context=cdk_json_context())
    stack = cdk.Stack(app, "Probe")
    iam.Role(
        stack,
        "Reader",
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonS3ReadOnlyAccess")],
    )
    return app, [stack]


@pytest.mark.slow
def test_nag_reports_an_unacknowledged_finding() -> None:
    _, findings, _ = run_nag(_factory_with_managed_policy, acknowledgments=())
    assert any(
        f.where == "Probe/Reader/Resource"
        and "AwsSolutions-IAM4" in f.message
        and "AmazonS3ReadOnlyAccess" in f.message
        for f in findings
    ), findings


@pytest.mark.slow
def test_nag_acknowledgment_on_the_resource_clears_it() -> None:
    ack = Acknowledgment(
        path="Reader",
        rule="AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonS3ReadOnlyAccess]",
        reason="test",
    )
    with pytest.raises(GateError, match="not resource-level"):
        run_nag(_factory_with_managed_policy, acknowledgments=(ack,))
    nested = Acknowledgment(path="Reader/Resource", rule=ack.rule, reason="test")
    _, findings, stale = run_nag(_factory_with_managed_policy, acknowledgments=(nested,))
    assert findings == []
    assert stale == []


def test_nag_refuses_stack_level_acknowledgments() -> None:
    blanket = Acknowledgment(path="*", rule="AwsSolutions::AwsSolutions-IAM4", reason="everything")
    with pytest.raises(GateError, match="not resource-level"):
        run_nag(_factory_with_managed_policy, acknowledgments=(blanket,))


@pytest.mark.slow
def test_nag_reports_stale_acknowledgments() -> None:
    stale_ack = Acknowledgment(path="Gone/Resource", rule="AwsSolutions::AwsSolutions-IAM4", reason="removed")
    _, _, stale = run_nag(_factory_with_managed_policy, acknowledgments=(stale_ack,))
    assert stale == [stale_ack]


# That every environment passes with only the listed acknowledgments (no finding, none stale, some rule results)
# is the cdk-nag gate over make test's one synth (gates/synth.py, gates/__main__.py gate_nag_synthesized).
def test_the_nag_gate_fails_when_cdk_nag_reports_no_rule_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    import gates.__main__ as gates_main

    monkeypatch.setattr(gates_main, "run_nag", lambda factory: (0, [], []))
    result = gates_main.gate_nag(Path("cdk.out"), Path("dist"))
    assert not result.passed
    assert "cdk-nag did not run" in result.findings[0].message


def test_every_acknowledgment_gives_a_specific_reason() -> None:
    for ack in ACKNOWLEDGMENTS:
        assert len(ack.reason) > 40, f"{ack.rule} needs a specific reason"


@pytest.mark.slow
def test_checkov_looks_inside_ray_objects(tmp_path: Path) -> None:
    """A privileged container inside a RayCluster's worker group is found, not skipped."""
    worker = {
        "name": "ray-worker",
        "image": "public.ecr.aws/x/y@sha256:" + "ab" * 32,
        "securityContext": {"privileged": True},
    }
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "ray"},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{**worker, "name": "ray-head"}]}}},
            "workerGroupSpecs": [{"groupName": "g6", "template": {"spec": {"containers": [worker]}}}],
        },
    }
    (tmp_path / "rc.yaml").write_text(json.dumps(cluster))
    _, findings = run_checkov(tmp_path)
    privileged = [f for f in findings if f.message.startswith("CKV_K8S_16")]
    assert {f.where.split()[-1] for f in privileged} == {"Pod.ray.rc-head", "Pod.ray.rc-g6"}


def test_the_nag_gate_over_a_shared_synth_needs_the_acknowledgments_it_used(tmp_path: Path) -> None:
    # make test's nag gate reads the report python -m gates.synth wrote; a cdk.out from `cdk synth` has none.
    from gates.nag import read_synthesized

    with pytest.raises(GateError, match=r"python -m gates\.synth"):
        read_synthesized(tmp_path)


def _report(tmp_path: Path, suppressed: list[tuple[str, str]]) -> Path:
    """A cdk-nag validation report whose only findings are `suppressed`: (construct path, acknowledged id)."""
    violations = [
        {
            "ruleName": rule.split("::", 1)[1],
            "violatingConstructs": [{"constructPath": path}],
            "acknowledgedId": rule,
        }
        for path, rule in suppressed
    ]
    report = {"pluginReports": [{"pluginName": "AwsSolutions", "violations": [], "suppressedViolations": violations}]}
    (tmp_path / "validation-report.json").write_text(json.dumps(report))
    return tmp_path


def test_an_acknowledgment_of_a_finding_that_no_longer_fires_is_stale(tmp_path: Path) -> None:
    """Its construct still exists (cdk-nag applied it), but no finding of that rule on that construct was acknowledged:
    the reason describes a grant the template no longer makes (issue 38: acknowledgments whose reasons were untrue)."""
    from gates.nag import read_report

    rule = "AwsSolutions::AwsSolutions-IAM5[Resource::*]"
    firing = Acknowledgment(path="Fn/ServiceRole/DefaultPolicy", rule=rule, reason="still granted")
    silent = Acknowledgment(path="Other/Role/DefaultPolicy", rule=rule, reason="no longer granted")
    other_rule = Acknowledgment(path="Fn/ServiceRole/DefaultPolicy", rule=rule.replace("*", "arn:x:*"), reason="r")
    outdir = _report(tmp_path, [("dev/Platform/Fn/ServiceRole/DefaultPolicy/Resource", rule)])
    _, findings, stale = read_report(outdir, (firing, silent, other_rule), used={0, 1, 2})
    assert findings == []
    assert stale == [silent, other_rule]


def test_a_used_acknowledgment_below_a_wildcard_path_matches_its_finding(tmp_path: Path) -> None:
    from gates.nag import read_report

    rule = "AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKSWorkerNodePolicy]"
    ack = Acknowledgment(path="GpuNodes-*/Nodegroup/NodeGroupRole", rule=rule, reason="node role")
    outdir = _report(tmp_path, [("prod/Gpu-p5/GpuNodes-p5/Nodegroup/NodeGroupRole/Resource", rule)])
    assert read_report(outdir, (ack,), used={0})[2] == []

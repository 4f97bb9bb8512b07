"""cdk-nag AwsSolutions checks (3.x, Validations API) on every environment."""

from __future__ import annotations

import fnmatch
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from gates.nag_acknowledgments import ACKNOWLEDGMENTS, Acknowledgment
from gates.report import Finding, GateError

GATE = "cdk-nag"

AppFactory = Callable[[str], tuple[cdk.App, Sequence[cdk.Stack]]]


def _below_stack(construct: IConstruct, stack: cdk.Stack) -> str:
    return construct.node.path[len(stack.node.path) + 1 :]


def acknowledge(stacks: Sequence[cdk.Stack], acknowledgments: Sequence[Acknowledgment]) -> set[int]:
    """Apply each acknowledgment to the constructs its path matches; return the indexes used."""
    used = set()
    for stack in stacks:
        for construct in stack.node.find_all():
            if construct is stack:
                continue
            below = _below_stack(construct, stack)
            for index, ack in enumerate(acknowledgments):
                if fnmatch.fnmatchcase(below, ack.path):
                    cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=ack.rule, reason=ack.reason))
                    used.add(index)
    return used


def run_nag(
    factory: AppFactory, acknowledgments: Sequence[Acknowledgment] = ACKNOWLEDGMENTS
) -> tuple[int, list[Finding], list[Acknowledgment]]:
    """(rules that ran, unacknowledged findings, acknowledgments that matched no construct)."""
    for ack in acknowledgments:
        if "/" not in ack.path or ack.path.startswith("*"):
            raise GateError(f"acknowledgment {ack.rule} at {ack.path!r} is not resource-level")
    with tempfile.TemporaryDirectory() as outdir:
        app, stacks = factory(outdir)
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        used = acknowledge(stacks, acknowledgments)
        try:
            app.synth()
        except RuntimeError as exc:
            if "Validation failed" not in str(exc) and "ValidationFailed" not in str(exc):
                raise
        report_path = Path(outdir) / "validation-report.json"
        if not report_path.exists():
            raise GateError("cdk-nag wrote no validation report")
        report = json.loads(report_path.read_text())
    findings, rules = [], 0
    for plugin in report["pluginReports"]:
        if plugin["pluginName"] != "AwsSolutions":
            continue
        rules = len(plugin.get("violations", [])) + len(plugin.get("suppressedViolations", []))
        for violation in plugin.get("violations", []):
            for construct in violation["violatingConstructs"]:
                findings.append(
                    Finding(GATE, construct["constructPath"], f"{violation['ruleName']}: {violation['description']}")
                )
    stale = [ack for index, ack in enumerate(acknowledgments) if index not in used]
    return rules, findings, stale

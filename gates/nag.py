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


# What `python -m gates.synth` writes beside the validation report: the acknowledgments that matched a construct.
USED_FILE = "nag-acknowledgments-used.json"


def check_acknowledgments(acknowledgments: Sequence[Acknowledgment]) -> None:
    for ack in acknowledgments:
        if "/" not in ack.path or ack.path.startswith("*"):
            raise GateError(f"acknowledgment {ack.rule} at {ack.path!r} is not resource-level")


def attach(app: cdk.App, stacks: Sequence[cdk.Stack], acknowledgments: Sequence[Acknowledgment]) -> set[int]:
    """The AwsSolutions pack as a validation plugin of `app`, the acknowledgments applied; the indexes used."""
    check_acknowledgments(acknowledgments)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return acknowledge(stacks, acknowledgments)


def synth(app: cdk.App) -> None:
    """Synthesizes `app`; a failed validation is the report's to tell, not an error."""
    try:
        app.synth()
    except RuntimeError as exc:
        if "Validation failed" not in str(exc) and "ValidationFailed" not in str(exc):
            raise


def _acknowledges(ack: Acknowledgment, construct_path: str, acknowledged_id: str) -> bool:
    """Whether `ack` is what cdk-nag applied to this finding: its rule, on its construct or one below it (the path in
    the report starts with the stage and stack, which the acknowledgment's path leaves out)."""
    return acknowledged_id == ack.rule and (
        fnmatch.fnmatchcase(construct_path, f"*/{ack.path}") or fnmatch.fnmatchcase(construct_path, f"*/{ack.path}/*")
    )


def read_report(
    outdir: Path, acknowledgments: Sequence[Acknowledgment], used: set[int]
) -> tuple[int, list[Finding], list[Acknowledgment]]:
    """(rules that ran, unacknowledged findings, stale acknowledgments: those that matched no construct, and those
    whose construct no longer has a finding of their rule, so their reason describes what the template does not do)."""
    report_path = outdir / "validation-report.json"
    if not report_path.exists():
        raise GateError("cdk-nag wrote no validation report")
    report = json.loads(report_path.read_text())
    findings, rules, suppressed = [], 0, []
    for plugin in report["pluginReports"]:
        if plugin["pluginName"] != "AwsSolutions":
            continue
        rules = len(plugin.get("violations", [])) + len(plugin.get("suppressedViolations", []))
        for violation in plugin.get("violations", []):
            for construct in violation["violatingConstructs"]:
                findings.append(
                    Finding(GATE, construct["constructPath"], f"{violation['ruleName']}: {violation['description']}")
                )
        suppressed += [
            (construct["constructPath"], violation.get("acknowledgedId", ""))
            for violation in plugin.get("suppressedViolations", [])
            for construct in violation["violatingConstructs"]
        ]
    stale = [
        ack
        for index, ack in enumerate(acknowledgments)
        if index not in used or not any(_acknowledges(ack, path, rule) for path, rule in suppressed)
    ]
    return rules, findings, stale


def run_nag(
    factory: AppFactory, acknowledgments: Sequence[Acknowledgment] = ACKNOWLEDGMENTS
) -> tuple[int, list[Finding], list[Acknowledgment]]:
    """cdk-nag over a synth of its own: (rules that ran, unacknowledged findings, acknowledgments unused)."""
    with tempfile.TemporaryDirectory() as outdir:
        app, stacks = factory(outdir)
        used = attach(app, stacks, acknowledgments)
        synth(app)
        return read_report(Path(outdir), acknowledgments, used)


def read_synthesized(
    cdk_out: Path, acknowledgments: Sequence[Acknowledgment] = ACKNOWLEDGMENTS
) -> tuple[int, list[Finding], list[Acknowledgment]]:
    """cdk-nag's report of the synth `python -m gates.synth` made into `cdk_out` (no second synth)."""
    used_file = cdk_out / USED_FILE
    if not used_file.exists():
        raise GateError(f"{cdk_out} has no {USED_FILE}: synthesize it with python -m gates.synth")
    used = set(json.loads(used_file.read_text())["used"])
    return read_report(cdk_out, acknowledgments, used)

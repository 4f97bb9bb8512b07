"""`trainctl plan --env E`: what CloudFormation would replace if the current code were deployed.

    trainctl plan --env prod                       against the templates deployed in the environment's region
    trainctl plan --env prod --snapshot            against the committed template snapshot instead
    trainctl plan --env prod --snapshot FILE       against another one (git show DEPLOYED_COMMIT:PATH > FILE)
    trainctl plan --env prod --json

The environment is synthesized here (as `cdk synth` does, account-agnostic) and compared with the templates
its stacks hold in CloudFormation (DescribeStacks, GetTemplate: trainctl/deployed_stacks.py; a stack not
deployed yet is new), or with `--snapshot`, the template snapshot committed in tests/infra/__snapshots__ (on a
clean checkout the current synth itself, so only a snapshot of the deployed commit shows what the deploy
changes). Every resource CloudFormation would replace is named with the create-only properties that changed
(the resource schemas cfn-lint ships: trainctl/template_plan.py); stateful ones (FSx, node groups, the
cluster, the KMS key, the VPC) and renamed PersistentVolumes/Claims are marked. Exit 1 on a replacement
CloudFormation cannot apply (a literal name kept) or a stateful one the environment does not acknowledge
(`acknowledged_replacements` in infra/spec/environments.py, each with a reason); exit 2 when the templates
cannot be read (an AWS error names the call and the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.spec import ConfigError, Environment, get_environment
from trainctl import flags
from trainctl.aws import AwsError
from trainctl.deployed_stacks import IAM_ACTIONS, DeployedStack, StackReads, deployed_stacks, templates
from trainctl.exit_codes import ExitCode
from trainctl.output import emit, table
from trainctl.preflight import aws_fix
from trainctl.template_plan import Plan, masked, plan_templates

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "infra" / "__snapshots__" / "test_stability"


def snapshot_path(env: str) -> Path:
    return SNAPSHOTS / f"test_template_snapshot[{env}].json"


@dataclass(frozen=True)
class Synth:
    templates: dict[str, dict[str, Any]]
    """Stack id (Platform, Storage, ...) -> its template, masked."""
    names: dict[str, str]
    """Stack id -> the CloudFormation stack name."""


def synthesize(environment: Environment) -> Synth:
    """The environment's stacks, with cdk.json's feature flags."""
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.stage import PlatformStage

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    with tempfile.TemporaryDirectory(prefix="trainctl-plan-") as outdir:
        app = cdk.App(context=context, outdir=outdir)
        stage = PlatformStage(app, environment.name, environment=environment)
        return Synth(
            templates={stack.node.id: masked(dict(Template.from_stack(stack).to_json())) for stack in stage.stacks},
            names={stack.node.id: stack.stack_name for stack in stage.stacks},
        )


@dataclass(frozen=True)
class Against:
    """What the synth was compared with: a snapshot file, or the stacks deployed in a region."""

    snapshot: Path | None = None
    region: str | None = None
    stacks: Mapping[str, DeployedStack] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "snapshot" if self.snapshot is not None else "deployed"

    def describe(self) -> str:
        if self.snapshot is not None:
            return f"the template snapshot {self.snapshot} (not the deployed templates)"
        accounts = sorted({s.account for s in self.stacks.values() if s.account})
        return f"the templates deployed in {self.region}" + (f" (account {', '.join(accounts)})" if accounts else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "against": self.kind,
            "snapshot": None if self.snapshot is None else str(self.snapshot),
            "region": self.region,
            "stacks": {stack_id: s.to_json() for stack_id, s in self.stacks.items()},
        }

    def stack_rows(self) -> str | None:
        if not self.stacks:
            return None
        rows = []
        for s in self.stacks.values():
            if not s.new:
                deployed = str(s.status)
            elif s.status is None:
                deployed = "new"
            else:
                deployed = f"new (it is {s.status}: no template deployed; cdk deploy creates it)"
            rows.append([s.id, s.name, deployed])
        return table(["STACK", "NAME", "DEPLOYED"], rows)


def render(plan: Plan, env: str, against: Against) -> str:
    out = [f"plan for {env}: the current synth against {against.describe()}"]
    stacks = against.stack_rows()
    if stacks:
        out.append(stacks)
    if plan.replacements:
        rows = []
        for r in plan.replacements:
            if r.blocked:
                status = "CANNOT APPLY"
            elif r.acknowledged is not None:
                status = f"acknowledged: {r.acknowledged}"
            elif r.stateful:
                status = "NOT ACKNOWLEDGED"
            else:
                status = "replaced"
            rows.append(
                [
                    r.stack,
                    r.logical_id,
                    r.type,
                    ", ".join(r.properties),
                    "yes" if r.stateful else "-",
                    status,
                    ", ".join(r.consumers) or "-",
                ]
            )
        out.append(table(["STACK", "LOGICAL ID", "TYPE", "CHANGED", "STATEFUL", "STATUS", "WEAK READERS"], rows))
    else:
        out.append("no resource is replaced")
    if plan.kubernetes:
        out.append("Kubernetes objects of the stateful kinds that appear or go:")
        out += [
            f"  {o.action:6} {o.kind} {o.namespace + '/' if o.namespace else ''}{o.name} ({o.stack})"
            for o in plan.kubernetes
        ]
        if any(o.kind == "PersistentVolume" for o in plan.kubernetes):
            out.append(
                f"  a bound claim cannot switch volumes: release the claims before the deploy "
                f"(trainctl drain --env {env} --release-claims), the Storage deploy creates them again"
            )
    for r in plan.replacements:
        if r.consumers:
            out.append(
                f"{r.logical_id} is read weakly by {', '.join(r.consumers)}: deploy "
                + " ".join(f"'{env}/{c}'" for c in r.consumers)
                + " after Platform (their templates change with it only if the output name changes)"
            )
    for ack in plan.unused_acknowledgments:
        out.append(f"unused acknowledgment {ack.stack}/{ack.logical_id}: remove it from acknowledged_replacements")
    for failure in plan.failures:
        out.append(f"FAIL {failure}")
    return "\n".join(out)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="name what CloudFormation would replace (the current synth against the deployed templates)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 nothing stateful replaced or all acknowledged, 1 an unacknowledged stateful or an "
        "impossible replacement, 2 could not run",
    )
    flags.add_env(parser)
    parser.add_argument(
        "--snapshot",
        nargs="?",
        const=True,
        type=Path,
        metavar="FILE",
        help="compare with a template snapshot instead of the deployed templates (default FILE: the committed one)",
    )
    flags.add_aws(parser, services=["cloudformation"])
    flags.add_output(parser, quiet=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    environment = get_environment(args.env)  # trainctl.flags.add_env checked the name
    before: dict[str, dict[str, Any]] = {}
    if args.snapshot is not None:
        path: Path = snapshot_path(environment.name) if args.snapshot is True else args.snapshot
        try:
            before = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: cannot read the template snapshot {path}: {exc}", file=sys.stderr)
            return ExitCode.ERROR
        against = Against(snapshot=path)
    try:
        after = synthesize(environment)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if args.snapshot is None:
        reads = StackReads(region=environment.region, profile=args.profile, endpoint_urls=dict(args.endpoint_url))
        try:
            stacks = deployed_stacks(reads, after.names)
        except AwsError as exc:
            fix = aws_fix(exc, environment.region, actions=" and ".join(IAM_ACTIONS))
            print(
                f"error: cannot read the deployed templates of {environment.name} in {environment.region}: "
                f"{exc.api}: {exc}\nfix: {fix}; or compare with a template snapshot: --snapshot [FILE]",
                file=sys.stderr,
            )
            return ExitCode.ERROR
        before = templates(stacks)
        against = Against(region=environment.region, stacks=stacks)
    plan = plan_templates(before, after.templates, acknowledged=environment.acknowledged_replacements)
    return emit(PlanReport(plan, environment.name, against), as_json=args.json)


@dataclass(frozen=True)
class PlanReport:
    """The plan of one environment against the deployed templates or a snapshot (trainctl.output.Report)."""

    plan: Plan
    env: str
    against: Against

    @property
    def exit_code(self) -> ExitCode:
        return self.plan.exit_code

    def to_json(self) -> dict[str, Any]:
        return {"command": "plan", "env": self.env, **self.against.to_json(), **self.plan.to_json()}

    def render(self) -> tuple[str, str]:
        return render(self.plan, self.env, self.against) + "\n", ""

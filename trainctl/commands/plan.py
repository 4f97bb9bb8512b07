"""`trainctl plan --env E`: what CloudFormation would replace if the current code were deployed.

    trainctl plan --env prod                       against the committed template snapshot
    trainctl plan --env prod --snapshot FILE       against another one (e.g. the last deployed commit's)
    trainctl plan --env prod --json

The environment is synthesized here (as `cdk synth` does, account-agnostic) and compared with the
template snapshot committed in tests/infra/__snapshots__ (what the last reviewed commit deploys). Every
resource CloudFormation would replace is named with the create-only properties that changed (the resource
schemas cfn-lint ships: trainctl/template_plan.py); stateful ones (FSx, node groups, the cluster, the KMS
key, the VPC) and renamed PersistentVolumes/Claims are marked. Exit 1 on a replacement CloudFormation
cannot apply (a literal name kept) or a stateful one the environment does not acknowledge
(`acknowledged_replacements` in infra/spec/environments.py, each with a reason).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.spec import ConfigError, Environment, get_environment
from trainctl import flags
from trainctl.exit_codes import ExitCode
from trainctl.output import emit, table
from trainctl.template_plan import Plan, plan_templates

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "infra" / "__snapshots__" / "test_stability"
_ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def snapshot_path(env: str) -> Path:
    return SNAPSHOTS / f"test_template_snapshot[{env}].json"


def masked(template: dict[str, Any]) -> dict[str, Any]:
    """Asset hashes masked, as the snapshot test stores templates (tests/infra/test_stability.py)."""
    out: dict[str, Any] = json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True)))
    return out


def synthesize(environment: Environment) -> dict[str, dict[str, Any]]:
    """The environment's templates (stack id -> template), with cdk.json's feature flags."""
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.stage import PlatformStage

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    with tempfile.TemporaryDirectory(prefix="trainctl-plan-") as outdir:
        app = cdk.App(context=context, outdir=outdir)
        stage = PlatformStage(app, environment.name, environment=environment)
        return {stack.node.id: masked(dict(Template.from_stack(stack).to_json())) for stack in stage.stacks}


def render(plan: Plan, env: str, against: Path) -> str:
    out = [f"plan for {env}: the current synth against {against}"]
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
        help="name what CloudFormation would replace (the current synth against the committed template snapshot)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 nothing stateful replaced or all acknowledged, 1 an unacknowledged stateful or an "
        "impossible replacement, 2 could not run",
    )
    flags.add_env(parser)
    parser.add_argument("--snapshot", type=Path, default=None, help="templates to compare with (default: committed)")
    flags.add_output(parser, quiet=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    environment = get_environment(args.env)  # trainctl.flags.add_env checked the name
    against: Path = args.snapshot or snapshot_path(environment.name)
    try:
        before: dict[str, dict[str, Any]] = json.loads(against.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the template snapshot {against}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    try:
        after = synthesize(environment)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    plan = plan_templates(before, after, acknowledged=environment.acknowledged_replacements)
    return emit(PlanReport(plan, environment.name, against), as_json=args.json)


@dataclass(frozen=True)
class PlanReport:
    """The plan of one environment against one snapshot (trainctl.output.Report)."""

    plan: Plan
    env: str
    against: Path

    @property
    def exit_code(self) -> ExitCode:
        return self.plan.exit_code

    def to_json(self) -> dict[str, Any]:
        return {"command": "plan", "env": self.env, "against": str(self.against), **self.plan.to_json()}

    def render(self) -> tuple[str, str]:
        return render(self.plan, self.env, self.against) + "\n", ""

"""`python -m gates`: every gate over cdk.out/ and dist/; exit 0 clean, 1 findings, 2 could not run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gates import outputs
from gates.cfn_lint import run_cfn_lint
from gates.checkov_gate import run_checkov
from gates.manifests import check_namespace_isolation, check_objects
from gates.nag import read_synthesized, run_nag
from gates.nag_acknowledgments import Acknowledgment
from gates.report import Finding, GateError, GateResult
from gates.runtime_packages import run_gate as run_runtime_packages
from gates.synth import app_factory
from gates.templates import check_template

ROOT = Path(__file__).resolve().parent.parent


def gate_templates(cdk_out: Path, dist: Path) -> GateResult:
    found = outputs.templates(cdk_out)
    findings = [f for name, template in found.items() for f in check_template(name, template)]
    return GateResult("templates", sum(len(t["Resources"]) for t in found.values()), findings)


def gate_cfn_lint(cdk_out: Path, dist: Path) -> GateResult:
    files = [cdk_out / name for name in outputs.templates(cdk_out)]
    return GateResult("cfn-lint", len(files), run_cfn_lint(files))


def gate_manifests(cdk_out: Path, dist: Path) -> GateResult:
    # Sources, each applied as a whole: an environment's dist/<env>/ and one template.
    sources: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for where, obj in outputs.manifests(dist):
        sources.setdefault(where.split("/", 1)[0], []).append((where, obj))
    for name, template in outputs.templates(cdk_out).items():
        sources[name] = [(f"{name}:{where}", obj) for where, obj in outputs.template_manifests(template)]
    objects = [item for items in sources.values() for item in items]
    return GateResult("manifests", len(objects), check_objects(objects) + check_namespace_isolation(sources))


def gate_checkov(cdk_out: Path, dist: Path) -> GateResult:
    passed, findings = run_checkov(dist)
    return GateResult("checkov", passed + len(findings), findings)


def gate_runtime_packages(cdk_out: Path, dist: Path) -> GateResult:
    checked, findings = run_runtime_packages(dist)
    return GateResult("runtime-packages", checked, findings)


def gate_nag(cdk_out: Path, dist: Path) -> GateResult:
    return nag_result(*run_nag(app_factory))


def gate_nag_synthesized(cdk_out: Path, dist: Path) -> GateResult:
    """cdk-nag's report of the synth `python -m gates.synth` wrote into cdk_out (make test's one synth)."""
    return nag_result(*read_synthesized(cdk_out))


def nag_result(checked: int, findings: list[Finding], stale: list[Acknowledgment]) -> GateResult:
    findings += [
        Finding(
            "cdk-nag",
            ack.path,
            f"stale acknowledgment of {ack.rule}: it matches no construct, or no finding of that rule there; "
            "delete it or rewrite it for what the template grants now (gates/nag_acknowledgments.py)",
        )
        for ack in stale
    ]
    if checked == 0:
        # Every environment has acknowledged findings: none at all means the AwsSolutions pack did not run.
        findings.append(Finding("cdk-nag", "(app)", "the AwsSolutions report has no rule result: cdk-nag did not run"))
    return GateResult("cdk-nag", checked, findings)


GATES: dict[str, Callable[[Path, Path], GateResult]] = {
    "templates": gate_templates,
    "cfn-lint": gate_cfn_lint,
    "manifests": gate_manifests,
    "checkov": gate_checkov,
    "runtime-packages": gate_runtime_packages,
    "cdk-nag": gate_nag,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gates", description=__doc__)
    parser.add_argument("--cdk-out", type=Path, default=ROOT / "cdk.out")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist")
    parser.add_argument("--only", choices=sorted(GATES), action="append", help="run only these gates")
    parser.add_argument(
        "--nag-from-cdk-out",
        action="store_true",
        help="read cdk-nag's report from --cdk-out, which python -m gates.synth wrote, instead of synthesizing again",
    )
    args = parser.parse_args(argv)

    gates = {**GATES, "cdk-nag": gate_nag_synthesized} if args.nag_from_cdk_out else GATES
    results, broken = [], []
    for name in args.only or gates:
        try:
            results.append(gates[name](args.cdk_out, args.dist))
        except GateError as exc:
            broken.append(f"{name}: {exc}")

    width = max(len("gate"), *(len(name) for name in GATES))
    print(f"{'gate':<{width}} {'checked':>8} {'findings':>9}  result")
    for result in results:
        verdict = "PASS" if result.passed else "FAIL"
        print(f"{result.gate:<{width}} {result.checked:>8} {len(result.findings):>9}  {verdict}")
    for line in broken:
        print(f"could not run: {line}", file=sys.stderr)
    for result in results:
        for finding in result.findings:
            print(finding, file=sys.stderr)
    if broken:
        return 2
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

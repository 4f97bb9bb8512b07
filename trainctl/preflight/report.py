"""The preflight report: its rows, exit code, JSON document, summary, fixes and table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl.exit_codes import ExitCode
from trainctl.output import table
from trainctl.preflight.results import (
    CheckResult,
    Status,
)


@dataclass
class PreflightReport:
    environment: str
    region: str | None
    environment_region: str | None
    results: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Problems that kept every check from starting (an unknown environment)."""

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL and r.ran]

    @property
    def not_run(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ran]

    @property
    def exit_code(self) -> ExitCode:
        """1 when a check ran and failed (even if others could not run): there is something to fix.
        2 when nothing failed but some check could not run, or none could start: no verdict."""
        if self.errors:
            return ExitCode.ERROR
        if self.failed:
            return ExitCode.CHECK_FAILED
        if self.not_run:
            return ExitCode.ERROR
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        verdicts = (Status.PASS, Status.WARN, Status.FAIL)
        counts = {status.value: sum(1 for r in self.results if r.status is status) for status in verdicts}
        counts["could_not_run"] = len(self.not_run)
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "preflight",
            "environment": self.environment,
            "region": self.region,
            "environment_region": self.environment_region,
            "exit_code": int(self.exit_code),
            "summary": self.summary(),
            "counts": self.counts(),
            "checks": [r.to_json() for r in self.results],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    def summary(self) -> str:
        if self.errors:
            return f"preflight could not run: {self.errors[0]}"
        counts = self.counts()
        tally = f"{counts['PASS']} PASS, {counts['WARN']} WARN, {counts['FAIL']} FAIL"
        where = f"environment {self.environment} in {self.region}"
        not_run = self.not_run
        if self.failed:
            names = ", ".join(f"{r.check.value} {r.subject}" for r in self.failed)
            also = f"; {len(not_run)} could not run" if not_run else ""
            return f"preflight failed for {where}: {tally} ({names}){also}. Fix them before cdk deploy"
        if not_run:
            first = not_run[0].reason.removeprefix("could not run: ")
            return (
                f"preflight incomplete for {where}: {len(not_run)} of {len(self.results)} check(s) could not run "
                f"({first}); none of the others failed"
            )
        warn = "; read the WARN rows" if counts["WARN"] else ""
        return f"preflight passed for {where}: {tally}{warn}"

    def fixes(self) -> list[str]:
        """One line per distinct fix, naming the row it is for, or how many rows (of which checks) share it."""
        by_fix: dict[str, list[CheckResult]] = {}
        for result in self.results:
            if result.fix:
                by_fix.setdefault(result.fix, []).append(result)
        lines = []
        for fix, results in by_fix.items():
            if len(results) == 1:
                label = f"{results[0].status.value} {results[0].check.value} {results[0].subject}"
            else:
                checks = ", ".join(dict.fromkeys(r.check.value for r in results))
                label = f"{len(results)} rows ({checks})"
            lines.append(f"{label}: {fix}")
        return lines

    def render(self) -> tuple[str, str]:
        """(stdout, stderr): the table, the fixes and the summary; warnings and errors on stderr."""
        out: list[str] = []
        if self.results:
            rows = [[r.check.value, r.subject, r.status.value, r.reason] for r in self.results]
            out.append(table(["CHECK", "SUBJECT", "STATUS", "REASON"], rows))
            fixes = self.fixes()
            if fixes:
                out += ["", "fixes:", *(f"  {line}" for line in fixes)]
            out.append("")
        err = [f"warning: {w}" for w in self.warnings] + [f"error: {e}" for e in self.errors]
        if self.errors:  # nothing ran: the error on stderr is the whole story
            return "", "".join(f"{line}\n" for line in err)
        out.append(self.summary())
        return "\n".join(out) + "\n", "".join(f"{line}\n" for line in err)

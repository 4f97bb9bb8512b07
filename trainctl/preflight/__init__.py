"""`trainctl preflight` as a package: one module per check (each with `gather(env, aws, say) -> rows`),
`results` (the row every check returns), `runner` (the tuple of checks and the loop over it) and `report`
(exit code, JSON, table); the command (the flags and the output) is trainctl/commands/preflight.py. The
names below are the library other modules use (capacity, scale, plan)."""

from __future__ import annotations

from trainctl.preflight.chart import ALL_CHARTS, chart_checks, chart_not_fetched
from trainctl.preflight.quota import quota_for
from trainctl.preflight.report import PreflightReport
from trainctl.preflight.results import ENVIRONMENT_TAG, Check, CheckResult, Status, aws_fix, could_not_run
from trainctl.preflight.runner import preflight, run_checks
from trainctl.preflight.subnet import evaluate_subnet

__all__ = [
    "ALL_CHARTS",
    "ENVIRONMENT_TAG",
    "Check",
    "CheckResult",
    "PreflightReport",
    "Status",
    "aws_fix",
    "chart_checks",
    "chart_not_fetched",
    "could_not_run",
    "evaluate_subnet",
    "preflight",
    "quota_for",
    "run_checks",
]

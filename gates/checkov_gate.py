"""checkov's Kubernetes checks over dist/; every skipped check is listed in .checkov.yaml with
its reason. checkov lives in its own virtualenv (.venv-checkov): its pins clash with ours."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gates.report import Finding, GateError

GATE = "checkov"
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".checkov.yaml"


def checkov_binary() -> Path:
    binary = Path(os.environ.get("CHECKOV_BIN", ROOT / ".venv-checkov" / "bin" / "checkov"))
    if not binary.exists():
        raise GateError(f"checkov not found at {binary}: run `make install` (it builds .venv-checkov)")
    return binary


def run_checkov(directory: Path) -> tuple[int, list[Finding]]:
    """(number of checks that passed, findings for the ones that failed)."""
    result = subprocess.run(
        [
            str(checkov_binary()),
            "--config-file",
            str(CONFIG),
            "--directory",
            str(directory),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    if result.returncode not in (0, 1):
        raise GateError(f"checkov could not run: {result.stderr.strip()[-500:]}")
    out = json.loads(result.stdout or "{}")
    reports = out if isinstance(out, list) else [out]
    passed, findings = 0, []
    for report in reports:
        if not report or "results" not in report:
            continue
        passed += report["summary"]["passed"]
        for check in report["results"]["failed_checks"]:
            findings.append(
                Finding(
                    GATE,
                    f"{check['file_path'].lstrip('/')} {check['resource']}",
                    f"{check['check_id']}: {check['check_name']}",
                )
            )
    return passed, findings

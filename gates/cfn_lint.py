"""cfn-lint over every synthesized template; ignores live in .cfnlintrc.yaml, each with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gates.report import Finding, GateError

GATE = "cfn-lint"
ROOT = Path(__file__).resolve().parent.parent


def run_cfn_lint(template_files: list[Path]) -> list[Finding]:
    if not template_files:
        raise GateError("cfn-lint: no templates given")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--format", "json", *map(str, template_files)],
        cwd=ROOT,  # picks up .cfnlintrc.yaml
        capture_output=True,
        text=True,
        check=False,
    )
    # cfn-lint exits with a bit mask of the levels found (2 error, 4 warning, 8 info); 1 is a crash.
    if result.returncode == 1 or (result.returncode and not result.stdout.strip()):
        raise GateError(f"cfn-lint could not run: {result.stderr.strip()[-500:]}")
    matches = json.loads(result.stdout or "[]")
    return [
        Finding(
            GATE,
            f"{Path(m['Filename']).name}:{m['Location']['Start']['LineNumber']}",
            f"{m['Rule']['Id']} ({m['Level']}): {m['Message']}",
        )
        for m in matches
    ]

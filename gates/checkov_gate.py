"""checkov's Kubernetes checks over dist/; every skipped check is listed in .checkov.yaml with
its reason. checkov lives in its own virtualenv (.venv-checkov): its pins clash with ours."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gates.report import Finding, GateError

GATE = "checkov"
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".checkov.yaml"


def checkov_binary() -> Path:
    binary = Path(os.environ.get("CHECKOV_BIN", ROOT / ".venv-checkov" / "bin" / "checkov"))
    if not binary.exists():
        raise GateError(f"checkov not found at {binary}: run `make install` (it builds .venv-checkov)")
    return binary


def ray_pods(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pods a RayCluster or RayJob will create, as Pod objects: checkov knows Pods, not the
    Ray CRDs, and would otherwise never look inside them."""
    kind = obj.get("kind")
    if kind not in ("RayCluster", "RayJob"):
        return
    spec = obj.get("spec", {})
    cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec", {})
    name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace", "default")
    templates = [("head", cluster.get("headGroupSpec", {}).get("template"))]
    templates += [(g["groupName"], g.get("template")) for g in cluster.get("workerGroupSpecs", [])]
    if kind == "RayJob":
        templates.append(("submitter", spec.get("submitterPodTemplate")))
    for role, template in templates:
        if template:
            yield {
                "apiVersion": "v1",
                "kind": "Pod",
                # The template's annotations come along: per-resource checkov acknowledgments live there.
                "metadata": {
                    "name": f"{name}-{role}",
                    "namespace": namespace,
                    **({"annotations": a} if (a := template.get("metadata", {}).get("annotations")) else {}),
                },
                "spec": template["spec"],
            }


def _scan_tree(directory: Path, into: Path) -> None:
    """Copy every manifest, adding the Ray pods next to the Ray objects that create them."""
    for path in sorted(directory.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        docs += [pod for doc in docs for pod in ray_pods(doc)]
        target = into / path.relative_to(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def run_checkov(directory: Path) -> tuple[int, list[Finding]]:
    """(number of checks that passed, findings for the ones that failed)."""
    with tempfile.TemporaryDirectory() as scan:
        _scan_tree(directory, Path(scan))
        return _checkov(Path(scan))


def _checkov(directory: Path) -> tuple[int, list[Finding]]:
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

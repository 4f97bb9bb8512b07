"""Reading what synth wrote: CloudFormation templates in cdk.out/, manifests in dist/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gates.report import GateError


def templates(cdk_out: Path) -> dict[str, dict[str, Any]]:
    """Every stack template of every stage assembly, by its path relative to cdk.out/."""
    found = {
        str(p.relative_to(cdk_out)): json.loads(p.read_text())
        for p in sorted(cdk_out.glob("assembly-*/*.template.json"))
    }
    if not found:
        raise GateError(f"no templates under {cdk_out}/assembly-*/: run `make synth` first")
    return found


def manifests(dist: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object in dist/, with 'file#index' as its location."""
    files = sorted(dist.rglob("*.yaml"))
    if not files:
        raise GateError(f"no manifests under {dist}/: run `make synth` first")
    for path in files:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                yield f"{path.relative_to(dist)}#{index}", doc


def render_manifest(manifest_property: Any) -> list[dict[str, Any]]:
    """A KubernetesResource's Manifest property as objects; CloudFormation tokens become '<token>'."""
    if isinstance(manifest_property, str):
        text = manifest_property
    else:
        text = "".join(p if isinstance(p, str) else "<token>" for p in manifest_property["Fn::Join"][1])
    objects: list[dict[str, Any]] = json.loads(text)
    return objects


def template_manifests(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Kubernetes objects CDK applies through the kubectl provider (tokens become '<token>')."""
    for logical_id, res in template.get("Resources", {}).items():
        if res.get("Type") == "Custom::AWSCDK-EKS-KubernetesResource":
            for index, obj in enumerate(render_manifest(res["Properties"]["Manifest"])):
                yield f"{logical_id}#{index}", obj

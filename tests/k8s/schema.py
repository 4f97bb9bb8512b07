"""Validation of emitted manifests against the real Kubernetes schema of the cluster version."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from infra.spec.versions import KUBERNETES_VERSION

SCHEMA_VERSION = f"{KUBERNETES_VERSION}.0"


def validate_core(manifest: dict[str, Any]) -> None:
    """Raise kubernetes_validate.ValidationError on any schema violation (strict: no unknown fields)."""
    kubernetes_validate.validate(manifest, SCHEMA_VERSION, strict=True)

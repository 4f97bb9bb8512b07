"""Objects the charts write as plain JSON (RBAC, admission policies, ConfigMaps): cdk8s.ApiObject with only a name
(and namespace, annotations) in its metadata and the rest patched in at the top level."""

from __future__ import annotations

from typing import Any

import cdk8s
from constructs import Construct

RBAC = "rbac.authorization.k8s.io/v1"
ADMISSION = "admissionregistration.k8s.io/v1"


def api_object(
    scope: Construct,
    construct_id: str,
    api_version: str,
    kind: str,
    name: str,
    namespace: str | None = None,
    annotations: dict[str, str] | None = None,
    **fields: Any,
) -> cdk8s.ApiObject:
    """An object with only a name (and namespace) in its metadata and `fields` at the top level."""
    obj = cdk8s.ApiObject(
        scope,
        construct_id,
        api_version=api_version,
        kind=kind,
        metadata=cdk8s.ApiObjectMetadata(name=name, namespace=namespace, annotations=annotations),
    )
    for key, value in fields.items():
        obj.add_json_patch(cdk8s.JsonPatch.add(f"/{key}", value))
    return obj

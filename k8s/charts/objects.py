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


def account(namespace: str, name: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def role_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def bound_role(
    scope: Construct,
    construct_id: str,
    name: str,
    namespace: str | None,
    rules: list[dict[str, Any]],
    subjects: list[dict[str, str]],
    annotations: dict[str, str] | None = None,
) -> None:
    """A Role (a ClusterRole where `namespace` is None) and its binding to `subjects`, both named `name`."""
    kind = "Role" if namespace is not None else "ClusterRole"
    api_object(scope, construct_id, RBAC, kind, name, namespace, annotations=annotations, rules=rules)
    api_object(
        scope,
        f"{construct_id}-binding",
        RBAC,
        f"{kind}Binding",
        name,
        namespace,
        annotations=annotations,
        roleRef=role_ref(kind, name),
        subjects=subjects,
    )


def deny_policy(scope: Construct, construct_id: str, name: str, spec: dict[str, Any]) -> None:
    """A ValidatingAdmissionPolicy and its binding, both named `name`, with validationActions [Deny]."""
    api_object(scope, construct_id, ADMISSION, "ValidatingAdmissionPolicy", name, spec=spec)
    binding = {"policyName": name, "validationActions": ["Deny"]}
    api_object(scope, f"{construct_id}-binding", ADMISSION, "ValidatingAdmissionPolicyBinding", name, spec=binding)

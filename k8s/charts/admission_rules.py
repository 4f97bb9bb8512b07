"""What the charts' ValidatingAdmissionPolicies are made of: CEL comparing an UPDATE's object with its oldObject, and a
policy on one identity's ClusterQueue updates. Standard CEL only (macros over lists and maps, has()), so the tests and
the rehearsal evaluate them with cel-python."""

from __future__ import annotations


def same(path: str) -> str:
    """`path` is unchanged: present in both with one value, or in neither."""
    return (
        f"(has(object.{path}) == has(oldObject.{path})) && (!has(object.{path}) || object.{path} == oldObject.{path})"
    )


def annotations_same_except(key: str) -> str:
    """Every annotation but `key` is unchanged: none added, removed or given another value."""
    new, old = "object.metadata.annotations", "oldObject.metadata.annotations"
    return (
        f"(!has({new}) || {new}.all(k, k == '{key}' || (has({old}) && k in {old} && {old}[k] == {new}[k]))) && "
        f"(!has({old}) || {old}.all(k, k == '{key}' || (has({new}) && k in {new})))"
    )


# Kueue v0.19.2 ClusterQueueSpec (v1beta2: k8s/crds/kueue-v0.19.2/kueue.x-k8s.io_clusterqueues.yaml), every field.
CLUSTER_QUEUE_SPEC_FIELDS = (
    "admissionChecksStrategy",
    "admissionScope",
    "cohortName",
    "concurrentAdmissionPolicy",
    "fairSharing",
    "flavorFungibility",
    "namespaceSelector",
    "preemption",
    "queueingStrategy",
    "resourceGroups",
    "stopPolicy",
)


def cluster_queue_changes_only(who: str, spec_field: str, annotation: str) -> tuple[tuple[str, str], ...]:
    """`who` may change one field of a ClusterQueue's spec and one annotation; nothing else of the spec or metadata."""
    return (
        *((same(f"spec.{f}"), f"{who} may not change spec.{f}") for f in CLUSTER_QUEUE_SPEC_FIELDS if f != spec_field),
        (annotations_same_except(annotation), f"{who} may change no annotation but {annotation}"),
        (same("metadata.labels"), f"{who} may not change a ClusterQueue's labels"),
        (same("metadata.ownerReferences"), f"{who} may not change a ClusterQueue's ownerReferences"),
        (same("metadata.finalizers"), f"{who} may not change a ClusterQueue's finalizers"),
    )


def cluster_queue_update_policy(name: str, username: str, rules: tuple[tuple[str, str], ...]) -> dict[str, object]:
    """A policy on one identity's ClusterQueue UPDATEs (a PATCH is admitted as an UPDATE), at v1beta2: the default
    matchPolicy Equivalent converts a request made at another version to it."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["kueue.x-k8s.io"],
                    "apiVersions": ["v1beta2"],
                    "operations": ["UPDATE"],
                    "resources": ["clusterqueues"],
                }
            ]
        },
        "matchConditions": [{"name": name, "expression": f"request.userInfo.username == '{username}'"}],
        "validations": [{"expression": e, "message": m} for e, m in rules],
    }

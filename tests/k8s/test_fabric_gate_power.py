"""Issue 34's findings over the emitted manifests of every file of an environment (read whole, wherever an object
lives): no workload pod's identity has any power over nodes; the identity that does cannot own, finalize or touch
a node outside the gated GPU groups; the gate's objects ship with the namespaces."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rehearse.manifests import yaml_documents
from tests.k8s.cel import denied

WORKLOAD_KINDS = {"Job", "RayJob", "RayCluster", "Deployment", "Pod"}
GATED_NAMESPACES = ("ray", "training")
TAINT_KEY = "platform/fabric-gate"


def documents(dist: Path, env: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted((dist / env).glob("*.k8s.yaml"))
        for doc in yaml_documents(path.read_text())
        if doc
    ]


def pod_specs(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node] if "containers" in node else []
        return found + [s for v in node.values() for s in pod_specs(v)]
    if isinstance(node, list):
        return [s for v in node for s in pod_specs(v)]
    return []


def grants_of(docs: list[dict[str, Any]], namespace: str, account: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every rule bound to system:serviceaccount:NAMESPACE:ACCOUNT."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    found = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount" and (s.get("namespace"), s["name"]) == (namespace, account)
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        role_namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_namespace, ref["name"]))
        assert role is not None, f"{binding['kind']}/{binding['metadata']['name']} binds a role no file emits"
        for rule in role.get("rules") or []:
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        found.add((group, resource, verb))
    return found


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_no_identity_a_workload_pod_runs_as_has_any_permission_on_nodes(dist: Path, env: str) -> None:
    docs = [d for _, d in documents(dist, env)]
    accounts = {
        (d["metadata"].get("namespace", "default"), spec.get("serviceAccountName", "default"))
        for d in docs
        if d["kind"] in WORKLOAD_KINDS and d["metadata"].get("namespace") in GATED_NAMESPACES
        for spec in pod_specs(d.get("spec"))
    }
    assert ("training", "fabric-gate") in accounts  # the gated NVRx job
    assert ("ray", "fabric-gate") in accounts  # the gated RayJob's workers
    for namespace, account in sorted(accounts):
        grants = grants_of(docs, namespace, account)
        assert not [g for g in grants if g[1].startswith("nodes") or g[1] == "*"], (namespace, account, grants)
        # What the gate uses, in its own namespace, and nothing else.
        assert grants <= {("", "events", "create"), ("", "events", "list")}, (namespace, account, grants)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_gate_and_its_controller_ship_in_the_namespaces_file(dist: Path, env: str) -> None:
    files = {name for name, d in documents(dist, env) if d["kind"] in ("ServiceAccount", "ValidatingAdmissionPolicy")}
    assert files == {"namespaces.k8s.yaml"}
    assert not (dist / env / "fabric-gate.k8s.yaml").exists()


def node_policies(dist: Path) -> list[dict[str, Any]]:
    return [
        d
        for _, d in documents(dist, "prod")
        if d["kind"] == "ValidatingAdmissionPolicy"
        and any("nodes" in r["resources"] for r in d["spec"]["matchConstraints"]["resourceRules"])
    ]


def gpu_node(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ip-10-1-2-3",
            "labels": {"role": "gpu-worker", "platform/gpu-group": "p5", **labels},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.1.2.3"},
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0abc",
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
        },
    }


def tainted(node: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(node)
    changed["spec"]["taints"].append({"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"})
    return changed


def test_the_node_policy_lets_the_taint_through_on_a_gated_gpu_worker(dist: Path) -> None:
    (policy,) = node_policies(dist)
    assert denied(policy, gpu_node(), tainted(gpu_node())) == []


@pytest.mark.parametrize(
    ("what", "edit", "message"),
    [
        (
            "an ownerReference (the garbage collector would delete the node)",
            lambda n: n["metadata"].update(
                ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]
            ),
            "ownerReferences",
        ),
        (
            "a finalizer (the node's deletion would wedge)",
            lambda n: n["metadata"].update(finalizers=["x/y"]),
            "finalizers",
        ),
    ],
)
def test_the_node_policy_refuses_owners_and_finalizers(dist: Path, what: str, edit: Any, message: str) -> None:
    (policy,) = node_policies(dist)
    new = tainted(gpu_node())
    edit(new)
    assert any(message in m for m in denied(policy, gpu_node(), new)), what


@pytest.mark.parametrize("labels", [{"role": "system"}, {"platform/gpu-group": "not-a-group"}])
def test_the_node_policy_refuses_nodes_outside_the_gated_gpu_groups(dist: Path, labels: dict[str, str]) -> None:
    (policy,) = node_policies(dist)
    old = gpu_node(**labels)
    assert denied(policy, old, tainted(old)), labels

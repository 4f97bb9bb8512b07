"""The fabric gate's identity, over the emitted objects: RBAC grants get/patch on nodes and create on events and
nothing else; the ValidatingAdmissionPolicy (its CEL evaluated with a CEL implementation over node objects) lets
that identity add its own NoSchedule taint and nothing else; every object validates against the 1.36 schema."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from gates.manifests import check_objects
from training.fabric_gate import TAINT_KEY

NAMESPACES = {"ray", "training"}


def objects(dist: Path, env: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((dist / env / "fabric-gate.k8s.yaml").read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_rbac_grants_node_get_patch_event_create_rayjob_get_and_nothing_else(dist: Path, env: str) -> None:
    docs = objects(dist, env)
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    roles = by_kind(docs, "Role")
    # A Node's Events go to "default" (the only namespace the API server accepts them in): one Role there too.
    assert {r["metadata"]["namespace"] for r in roles} == {*NAMESPACES, "default"}
    events = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    # In the workloads' namespaces the gate also reads the RayJob it reports on: its Event must carry the RayJob's
    # uid, which no pod of a RayJob's cluster is given (kubectl describe selects Events by involvedObject.uid).
    rayjobs = {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get"]}
    for role in roles:
        expected = [events] if role["metadata"]["namespace"] == "default" else [events, rayjobs]
        assert role["rules"] == expected
    # Every rule of every role this chart emits, flattened: nothing but these three grants exists.
    grants = {
        (group, resource, verb)
        for role in [cluster_role, *roles]
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert grants == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "events", "create"),
        ("ray.io", "rayjobs", "get"),
    }
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert {(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]} == {
        ("ServiceAccount", "fabric-gate", ns) for ns in NAMESPACES
    }
    for role_binding in by_kind(docs, "RoleBinding"):
        assert role_binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "fabric-gate-events",
        }
        namespace = role_binding["metadata"]["namespace"]
        subjects = NAMESPACES if namespace == "default" else {namespace}
        assert role_binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "fabric-gate", "namespace": ns} for ns in sorted(subjects)
        ]
    assert {(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in by_kind(docs, "ServiceAccount")} == {
        (ns, "fabric-gate") for ns in NAMESPACES
    }


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_objects_pass_the_manifest_gate_and_the_1_36_schema(dist: Path, env: str) -> None:
    assert check_objects((f"fabric-gate[{i}]", d) for i, d in enumerate(objects(dist, env))) == []


def policy(dist: Path) -> dict[str, Any]:
    (vap,) = by_kind(objects(dist, "prod"), "ValidatingAdmissionPolicy")
    return vap


def test_policy_matches_node_updates_by_the_gate_only_and_denies(dist: Path) -> None:
    vap = policy(dist)
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    (binding,) = by_kind(objects(dist, "prod"), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    (condition,) = vap["spec"]["matchConditions"]
    matches = _program(condition["expression"])
    for username, expected in (
        ("system:serviceaccount:training:fabric-gate", True),
        ("system:serviceaccount:ray:fabric-gate", True),
        ("system:serviceaccount:training:default", False),
        ("kubernetes-admin", False),
    ):
        assert bool(matches.evaluate({"request": json_to_cel({"userInfo": {"username": username}})})) is expected


def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def node(taints: list[dict[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ip-10-1-2-3",
            "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.1.2.3"},
        },
        "spec": {"providerID": "aws:///us-east-1a/i-0abc", **({"taints": taints} if taints else {}), **spec},
    }


GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GATE = {"key": TAINT_KEY, "value": "below-floor", "effect": "NoSchedule"}


def denied(dist: Path, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the validations that fail for this update (what the API server would answer)."""
    activation = {"object": json_to_cel(new), "oldObject": json_to_cel(old)}
    failed = []
    for validation in policy(dist)["spec"]["validations"]:
        if not bool(_program(validation["expression"]).evaluate(activation)):
            failed.append(validation["message"])
    return failed


def test_adding_the_gate_taint_is_allowed(dist: Path) -> None:
    assert denied(dist, node([GPU]), node([GPU, GATE])) == []
    assert denied(dist, node(), node([GATE])) == []
    # The gate re-running on a node it tainted before (the value may change, the taint stays).
    assert denied(dist, node([GPU, GATE]), node([GPU, {**GATE, "value": "fallback"}])) == []


def _changed(base: dict[str, Any], edit: Any) -> dict[str, Any]:
    changed = copy.deepcopy(base)
    edit(changed)
    return changed


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("remove another taint", lambda n: n["spec"].update(taints=[GATE]), "no taint but"),
        (
            "change another taint",
            lambda n: n["spec"].update(taints=[{**GPU, "effect": "NoExecute"}, GATE]),
            "no taint but",
        ),
        (
            "NoExecute gate taint",
            lambda n: n["spec"].update(taints=[GPU, {**GATE, "effect": "NoExecute"}]),
            "NoSchedule",
        ),
        ("cordon", lambda n: n["spec"].update(taints=[GPU, GATE], unschedulable=True), "spec.unschedulable"),
        ("relabel", lambda n: n["metadata"]["labels"].update(role="system"), "labels"),
        ("annotate", lambda n: n["metadata"]["annotations"].update(x="y"), "annotations"),
        ("provider id", lambda n: n["spec"].update(providerID="aws:///x"), "spec.providerID"),
    ],
)
def test_anything_else_is_denied(dist: Path, name: str, edit: Any, message: str) -> None:
    old = node([GPU])
    new = _changed(old, edit)
    if "taints" not in new["spec"] or all(t["key"] != TAINT_KEY for t in new["spec"]["taints"]):
        new["spec"].setdefault("taints", []).append(GATE)
    failed = denied(dist, old, new)
    assert any(message in m for m in failed), (name, failed)


def test_the_gate_cannot_release_its_own_taint(dist: Path) -> None:
    failed = denied(dist, node([GPU, GATE]), node([GPU]))
    assert any("never removes" in m for m in failed)


def _pod_specs(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node] if "containers" in node else []
        return found + [s for v in node.values() for s in _pod_specs(v)]
    if isinstance(node, list):
        return [s for v in node for s in _pod_specs(v)]
    return []


def _gated_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Pod specs whose training runs the gate: a container with --fabric-gate on its command line, or a RayJob's
    worker pods when its entrypoint (the Ray Train driver) passes --fabric-gate to the workers' function."""
    if doc.get("kind") == "RayJob" and "--fabric-gate" in doc["spec"].get("entrypoint", ""):
        groups = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        return [g["template"]["spec"] for g in groups]
    return [
        spec
        for spec in _pod_specs(doc)
        if any(
            "--fabric-gate" in " ".join(map(str, [*c.get("command", []), *c.get("args", [])]))
            for c in spec["containers"]
        )
    ]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_every_gated_pod_knows_its_node_and_runs_as_the_gate(dist: Path, env: str) -> None:
    """The gate names the node at fault from NODE_NAME (the Downward API's spec.nodeName, which the cluster
    rehearsal fills with the node the scheduler chose) and takes it out with the fabric-gate identity."""
    kinds = set()
    for path in sorted((dist / env).glob("*.k8s.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for spec in _gated_pods(doc or {}):
                kinds.add(doc["kind"])
                for container in spec["containers"]:
                    env_vars = {e["name"]: e for e in container.get("env", [])}
                    assert env_vars["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, path
                assert spec["serviceAccountName"] == "fabric-gate", path
                assert spec["automountServiceAccountToken"] is True, path
    assert kinds == {"Job", "RayJob"}, "the NVRx Job and the RayJob's workers are gated"

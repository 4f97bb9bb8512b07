"""The fabric gate's identities over the emitted objects (k8s/charts/fabric_gate.py): the gated pods may create and
list Events in their own namespace; the controller's identity holds exactly what it uses, and its node policy (the
CEL evaluated with a CEL implementation over node objects) lets it add the gate's NoSchedule taint to a gated GPU
worker and nothing else; the controller runs our code, pinned, restricted, on the system nodes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from celpy.adapter import json_to_cel

from fabric_controller.config import ControllerConfig
from gates.manifests import check_objects
from infra.spec import ENVIRONMENTS
from k8s.charts.fabric_gate import CONTROLLER_SOURCES, POLICY, controller_config
from k8s.charts.small_controller import ROOT
from rehearse.manifests import yaml_documents
from tests.k8s import cel
from training.fabric_verdict import TAINT_KEY

NAMESPACES = {"ray", "training"}
CONTROLLER = ("fabric-gate-system", "fabric-gate-controller")


def objects(dist: Path, env: str) -> list[dict[str, Any]]:
    return [d for d in yaml_documents((dist / env / "namespaces.k8s.yaml").read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rules(role: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (group, resource, verb, tuple(rule.get("resourceNames") or ()))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def bound_to(docs: list[dict[str, Any]], namespace: str, account: str) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles bound to the ServiceAccount."""
    found = []
    for binding in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        (role,) = [
            d
            for d in by_kind(docs, ref["kind"])
            if (d["metadata"]["name"], d["metadata"].get("namespace")) == (ref["name"], where)
        ]
        found.append(role)
    return found


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_gated_pods_may_create_and_list_events_in_their_namespace_and_nothing_else(dist: Path, env: str) -> None:
    docs = objects(dist, env)
    for namespace in NAMESPACES:
        (role,) = bound_to(docs, namespace, "fabric-gate")
        assert role["kind"] == "Role"
        assert role["metadata"]["namespace"] == namespace
        assert rules(role) == {("", "events", "create", ()), ("", "events", "list", ())}


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_controller_holds_what_it_uses_and_cannot_delete_own_or_finalize_a_node(dist: Path, env: str) -> None:
    docs = objects(dist, env)
    roles = bound_to(docs, *CONTROLLER)
    queues = tuple(sorted(f"gpu-{g.name}" for g in ENVIRONMENTS[env].gpu_node_groups if g.gated))
    (cluster_role,) = [r for r in roles if r["kind"] == "ClusterRole"]
    assert rules(cluster_role) == {
        ("", "nodes", "get", ()),
        ("", "nodes", "list", ()),
        ("", "nodes", "patch", ()),
        ("kueue.x-k8s.io", "clusterqueues", "get", queues),
        ("kueue.x-k8s.io", "clusterqueues", "patch", queues),
    }
    by_namespace = {r["metadata"]["namespace"]: rules(r) for r in roles if r["kind"] == "Role"}
    assert by_namespace.pop("default") == {("", "events", "create", ())}
    assert set(by_namespace) == NAMESPACES
    common = {
        ("", "pods", "get", ()),
        ("kueue.x-k8s.io", "workloads", "list", ()),
        ("", "events", "create", ()),
        ("", "events", "list", ()),
    }
    # Each namespace's gated pods' owners, and only those: the NVRx Job in training; a RayJob's RayCluster and the
    # RayJob in ray (no RayJob lives in training, no gated batch Job in ray).
    assert by_namespace["training"] == common | {("batch", "jobs", "get", ())}
    assert by_namespace["ray"] == common | {("ray.io", "rayclusters", "get", ()), ("ray.io", "rayjobs", "get", ())}
    # No delete, update or escalation anywhere; a node's owners and finalizers are the policy's (below).
    verbs = {verb for role in roles for (_, _, verb, _) in rules(role)}
    assert verbs == {"get", "list", "patch", "create"}


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_objects_pass_the_manifest_gate_and_the_1_36_schema(dist: Path, env: str) -> None:
    assert check_objects((f"namespaces[{i}]", d) for i, d in enumerate(objects(dist, env))) == []


def policy(dist: Path) -> dict[str, Any]:
    # The node policy (the namespaces' file also holds the pod policy, k8s/charts/pod_security.py).
    (vap,) = [d for d in by_kind(objects(dist, "prod"), "ValidatingAdmissionPolicy") if d["metadata"]["name"] == POLICY]
    return vap


def test_the_policy_matches_node_updates_by_the_controller_only_and_denies(dist: Path) -> None:
    vap = policy(dist)
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    (binding,) = [
        d for d in by_kind(objects(dist, "prod"), "ValidatingAdmissionPolicyBinding") if d["metadata"]["name"] == POLICY
    ]
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    (condition,) = vap["spec"]["matchConditions"]
    matches = cel.program(condition["expression"])
    for username, expected in (
        ("system:serviceaccount:fabric-gate-system:fabric-gate-controller", True),
        ("system:serviceaccount:training:fabric-gate", False),
        ("kubernetes-admin", False),
    ):
        assert bool(matches.evaluate({"request": json_to_cel({"userInfo": {"username": username}})})) is expected


def node(taints: list[dict[str, str]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ip-10-1-2-3",
            "labels": {
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "role": "gpu-worker",
                "platform/gpu-group": "p5",
            },
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.1.2.3"},
        },
        "spec": {"providerID": "aws:///us-east-1a/i-0abc", **({"taints": taints} if taints else {}), **spec},
    }


GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GATE = {"key": TAINT_KEY, "value": "below-floor", "effect": "NoSchedule"}


def denied(dist: Path, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the validations that fail for this update (what the API server would answer)."""
    return cel.denied(policy(dist), old, new)


def test_adding_the_gate_taint_to_a_gated_gpu_worker_is_allowed(dist: Path) -> None:
    assert denied(dist, node([GPU]), node([GPU, GATE])) == []
    assert denied(dist, node(), node([GATE])) == []
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
        (
            "owner",
            lambda n: n["metadata"].update(ownerReferences=[{"kind": "ConfigMap", "name": "x", "uid": "u"}]),
            "ownerReferences",
        ),
        ("finalizer", lambda n: n["metadata"].update(finalizers=["example.com/hold"]), "finalizers"),
    ],
)
def test_anything_else_is_denied(dist: Path, name: str, edit: Any, message: str) -> None:
    old = node([GPU])
    new = _changed(old, edit)
    if "taints" not in new["spec"] or all(t["key"] != TAINT_KEY for t in new["spec"]["taints"]):
        new["spec"].setdefault("taints", []).append(GATE)
    failed = denied(dist, old, new)
    assert any(message in m for m in failed), (name, failed)


def test_a_system_node_and_a_node_of_no_gated_group_are_out_of_reach(dist: Path) -> None:
    for labels in ({"role": "system"}, {"platform/gpu-group": "x"}, {"role": None}):
        old = node([GPU])
        for key, value in labels.items():
            if value is None:
                old["metadata"]["labels"].pop(key)
            else:
                old["metadata"]["labels"][key] = value
        assert any(
            "only change GPU workers of a gated group" in m
            for m in denied(dist, old, _changed(old, lambda n: n["spec"]["taints"].append(GATE)))
        ), labels


def test_the_controller_cannot_release_the_taint(dist: Path) -> None:
    assert any("never removes" in m for m in denied(dist, node([GPU, GATE]), node([GPU])))


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_controller_runs_our_code_pinned_restricted_on_the_system_nodes(dist: Path, env: str) -> None:
    docs = objects(dist, env)
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["metadata"]["namespace"] == "fabric-gate-system"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "@sha256:" in container["image"]
    assert pod["nodeSelector"] == {"role": "system"}
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("fabric-gate-controller", True)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    (namespace,) = [d for d in by_kind(docs, "Namespace") if d["metadata"]["name"] == "fabric-gate-system"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    configmaps = {c["metadata"]["name"]: c["data"] for c in by_kind(docs, "ConfigMap")}
    code = configmaps["fabric-gate-controller-code"]
    # The files as they are in the repository, under keys the volume maps back to their paths.
    assert {k.replace("--", "/"): v for k, v in code.items()} == {p: (ROOT / p).read_text() for p in CONTROLLER_SOURCES}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "code"]
    assert {i["path"] for i in volume["configMap"]["items"]} == set(CONTROLLER_SOURCES)
    config = ControllerConfig.from_json(json.loads(configmaps["fabric-gate-controller-config"]["config.json"]))
    assert config == controller_config(ENVIRONMENTS[env], ("ray", "training"))
    assert set(config.groups) == {g.name for g in ENVIRONMENTS[env].gpu_node_groups if g.gated}
    assert config.groups


def unshipped_imports(sources: tuple[str, ...], packages: tuple[str, ...]) -> list[tuple[str, str]]:
    """(file, module) for each `from PACKAGE... import` in a shipped source whose module does not ship with it."""
    import ast

    shipped = {p.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for p in sources}
    return [
        (path, node.module)
        for path in sources
        for node in ast.walk(ast.parse((ROOT / path).read_text()))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.split(".")[0] in packages
        and node.module not in shipped
    ]


def test_every_module_the_controller_imports_ships_with_it() -> None:
    assert unshipped_imports(CONTROLLER_SOURCES, ("training", "fabric_controller")) == []


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_every_gated_pod_knows_its_node_and_uid_and_runs_as_the_gate(dist: Path, env: str) -> None:
    kinds = set()
    for path in sorted((dist / env).glob("*.k8s.yaml")):
        for doc in yaml_documents(path.read_text()):
            for spec in _gated_pods(doc or {}):
                kinds.add(doc["kind"])
                for container in spec["containers"]:
                    env_vars = {e["name"]: e for e in container.get("env", [])}
                    assert env_vars["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, path
                    assert env_vars["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}, path
                assert spec["serviceAccountName"] == "fabric-gate", path
                assert spec["automountServiceAccountToken"] is True, path
    assert kinds == {"Job", "RayJob"}, "the NVRx Job and the RayJob's workers are gated"


def _pod_specs(node_: Any) -> list[dict[str, Any]]:
    if isinstance(node_, dict):
        found = [node_] if "containers" in node_ else []
        return found + [s for v in node_.values() for s in _pod_specs(v)]
    if isinstance(node_, list):
        return [s for v in node_ for s in _pod_specs(v)]
    return []


def _gated_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc.get("kind") == "RayJob" and "--fabric-gate" in doc["spec"].get("entrypoint", ""):
        return [g["template"]["spec"] for g in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    return [
        spec
        for spec in _pod_specs(doc)
        if any(
            "--fabric-gate" in " ".join(map(str, [*c.get("command", []), *c.get("args", [])]))
            for c in spec["containers"]
        )
    ]

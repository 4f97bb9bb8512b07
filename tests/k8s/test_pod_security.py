"""Issue 38: `ray` and `training` enforce Privileged Pod Security only because Pod Security Admission cannot admit
IPC_LOCK alone; the ValidatingAdmissionPolicy emitted with the namespaces (k8s/charts/pod_security.py) holds their
pods to Baseline plus IPC_LOCK. Its CEL, evaluated with cel-python over Pod objects (tests/k8s/cel.py): every pod
our manifests make passes; each Baseline violation (kubernetes/pod-security-admission v0.36.2 policy/check_*.go)
is denied with a message naming the field; IPC_LOCK alone is admitted."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.spec.pod_security import BASELINE_CAPABILITIES, BASELINE_CHECKS, CHECKED_FOR, IPC_LOCK, SAFE_SYSCTLS
from infra.spec.versions import KUBERNETES_VERSION
from rehearse.manifests import yaml_documents
from tests.k8s.cel import request_denied
from tests.k8s.namespaces_chart import namespaces_chart_objects
from tests.k8s.schema import validate_core

APPARMOR_MAIN = "container.apparmor.security.beta.kubernetes.io/main"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
WORKLOAD_NAMESPACES = {"ray", "training"}


def chart_objects() -> list[dict[str, Any]]:
    return namespaces_chart_objects()


def pod_policy(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (policy,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and any("pods" in r["resources"] for r in d["spec"]["matchConstraints"]["resourceRules"])
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    return policy, binding


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    return pod_policy(chart_objects())[0]


def pod(**spec: Any) -> dict[str, Any]:
    """A Baseline pod with the EFA pods' container context (drop ALL, add IPC_LOCK)."""
    container = {
        "name": "main",
        "image": "example/trainer@sha256:" + "0" * 64,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": [IPC_LOCK]},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "training"},
        "spec": {"containers": [container], **spec},
    }


def main(p: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = p["spec"]["containers"][0]
    return container


def context(p: dict[str, Any]) -> dict[str, Any]:
    security: dict[str, Any] = main(p)["securityContext"]
    return security


def pod_context(p: dict[str, Any]) -> dict[str, Any]:
    security: dict[str, Any] = p["spec"].setdefault("securityContext", {})
    return security


def init(p: dict[str, Any], **fields: Any) -> None:
    p["spec"]["initContainers"] = [{"name": "setup", "image": "example/setup", **fields}]


def ephemeral(p: dict[str, Any], **fields: Any) -> None:
    p["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "example/debug", **fields}]


def test_the_checks_are_those_of_the_cluster_version() -> None:
    assert CHECKED_FOR == KUBERNETES_VERSION, "read pod-security-admission's policy/ at the new tag, then update"


def test_the_policy_matches_the_pods_of_the_privileged_namespaces_and_denies() -> None:
    docs = chart_objects()
    policy, binding = pod_policy(docs)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["pods", "pods/ephemeralcontainers"],
    }
    assert binding["spec"]["validationActions"] == ["Deny"]
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ray", "training"]}]
    }
    privileged = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Namespace" and d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    }
    assert privileged == WORKLOAD_NAMESPACES
    for obj in docs:
        if obj["kind"] in POLICY_KINDS:
            validate_core(obj)


def test_every_baseline_check_has_a_validation_citing_its_source(policy: dict[str, Any]) -> None:
    messages = [v["message"] for v in policy["spec"]["validations"]]
    for check, source in BASELINE_CHECKS.items():
        assert any(f"({check}, {source})" in m for m in messages), (check, messages)


def test_ipc_lock_alone_and_baseline_capabilities_are_admitted(policy: dict[str, Any]) -> None:
    assert request_denied(policy, pod()) == []
    p = pod()
    context(p)["capabilities"]["add"] = [IPC_LOCK, *BASELINE_CAPABILITIES]
    assert request_denied(policy, p) == []


ADMITTED: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("privileged false", lambda p: context(p).update(privileged=False)),
    ("host namespaces false", lambda p: p["spec"].update(hostNetwork=False, hostPID=False, hostIPC=False)),
    ("a containerPort without a hostPort", lambda p: main(p).update(ports=[{"containerPort": 8265}])),
    ("hostPort 0", lambda p: main(p).update(ports=[{"containerPort": 80, "hostPort": 0}])),
    ("emptyDir and PVC volumes", lambda p: p["spec"].update(volumes=[{"name": "a", "emptyDir": {}}])),
    ("seccomp RuntimeDefault", lambda p: pod_context(p).update(seccompProfile={"type": "RuntimeDefault"})),
    (
        "seccomp Localhost on a container",
        lambda p: context(p).update(seccompProfile={"type": "Localhost", "localhostProfile": "x.json"}),
    ),
    ("every safe sysctl", lambda p: pod_context(p).update(sysctls=[{"name": n, "value": "1"} for n in SAFE_SYSCTLS])),
    ("AppArmor RuntimeDefault", lambda p: context(p).update(appArmorProfile={"type": "RuntimeDefault"})),
    (
        "an AppArmor localhost annotation",
        lambda p: p["metadata"].update(annotations={APPARMOR_MAIN: "localhost/x"}),
    ),
    (
        "SELinux container_engine_t (1.31+)",
        lambda p: pod_context(p).update(seLinuxOptions={"type": "container_engine_t"}),
    ),
    ("procMount Default", lambda p: context(p).update(procMount="Default")),
    (
        "procMount Unmasked in a user namespace",
        lambda p: (context(p).update(procMount="Unmasked"), p["spec"].update(hostUsers=False)),
    ),
    ("a probe without host", lambda p: main(p).update(readinessProbe={"httpGet": {"path": "/", "port": 80}})),
]


@pytest.mark.parametrize(("what", "edit"), ADMITTED, ids=[a[0] for a in ADMITTED])
def test_what_baseline_allows_is_admitted(
    policy: dict[str, Any], what: str, edit: Callable[[dict[str, Any]], None]
) -> None:
    p = pod()
    edit(p)
    assert request_denied(policy, p) == [], what


DENIED: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("a privileged container", lambda p: context(p).update(privileged=True), "securityContext.privileged"),
    (
        "a privileged initContainer",
        lambda p: init(p, securityContext={"privileged": True}),
        "securityContext.privileged",
    ),
    (
        "a privileged ephemeralContainer",
        lambda p: ephemeral(p, securityContext={"privileged": True}),
        "securityContext.privileged",
    ),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "spec.hostPID"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC"),
    (
        "a hostPath volume",
        lambda p: p["spec"].update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "spec.volumes[*].hostPath",
    ),
    (
        "a hostPort",
        lambda p: main(p).update(ports=[{"containerPort": 80, "hostPort": 80}]),
        "ports[*].hostPort",
    ),
    (
        "a hostPort on an initContainer",
        lambda p: init(p, ports=[{"containerPort": 80, "hostPort": 8080}]),
        "ports[*].hostPort",
    ),
    ("SYS_ADMIN", lambda p: context(p)["capabilities"].update(add=[IPC_LOCK, "SYS_ADMIN"]), "capabilities.add"),
    (
        "NET_RAW (not in Baseline's list)",
        lambda p: context(p)["capabilities"].update(add=["NET_RAW"]),
        "capabilities.add",
    ),
    ("ALL", lambda p: context(p)["capabilities"].update(add=["ALL"]), "capabilities.add"),
    (
        "SYS_PTRACE on an ephemeralContainer",
        lambda p: ephemeral(p, securityContext={"capabilities": {"add": ["SYS_PTRACE"]}}),
        "capabilities.add",
    ),
    (
        "seccomp Unconfined on the pod",
        lambda p: pod_context(p).update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile.type",
    ),
    (
        "seccomp Unconfined on a container",
        lambda p: context(p).update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile.type",
    ),
    (
        "seccomp Unconfined on an initContainer",
        lambda p: init(p, securityContext={"seccompProfile": {"type": "Unconfined"}}),
        "seccompProfile.type",
    ),
    (
        "an unsafe sysctl",
        lambda p: pod_context(p).update(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
        "spec.securityContext.sysctls[*].name",
    ),
    (
        "hostProcess on the pod",
        lambda p: pod_context(p).update(windowsOptions={"hostProcess": True}),
        "windowsOptions.hostProcess",
    ),
    (
        "hostProcess on a container",
        lambda p: context(p).update(windowsOptions={"hostProcess": True}),
        "windowsOptions.hostProcess",
    ),
    (
        "AppArmor Unconfined on the pod",
        lambda p: pod_context(p).update(appArmorProfile={"type": "Unconfined"}),
        "appArmorProfile.type",
    ),
    (
        "AppArmor Unconfined on a container",
        lambda p: context(p).update(appArmorProfile={"type": "Unconfined"}),
        "appArmorProfile.type",
    ),
    (
        "an AppArmor unconfined annotation",
        lambda p: p["metadata"].update(annotations={APPARMOR_MAIN: "unconfined"}),
        "container.apparmor.security.beta.kubernetes.io/*",
    ),
    (
        "SELinux type spc_t",
        lambda p: pod_context(p).update(seLinuxOptions={"type": "spc_t"}),
        "seLinuxOptions",
    ),
    ("SELinux user", lambda p: context(p).update(seLinuxOptions={"user": "system_u"}), "seLinuxOptions"),
    ("SELinux role", lambda p: context(p).update(seLinuxOptions={"role": "system_r"}), "seLinuxOptions"),
    ("procMount Unmasked", lambda p: context(p).update(procMount="Unmasked"), "securityContext.procMount"),
    (
        "a probe's httpGet host",
        lambda p: main(p).update(livenessProbe={"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}),
        ".host",
    ),
    (
        "a probe's tcpSocket host",
        lambda p: main(p).update(startupProbe={"tcpSocket": {"host": "10.0.0.1", "port": 22}}),
        ".host",
    ),
    (
        "a lifecycle hook's httpGet host",
        lambda p: main(p).update(lifecycle={"preStop": {"httpGet": {"host": "10.0.0.1", "port": 80}}}),
        ".host",
    ),
]


@pytest.mark.parametrize(("what", "edit", "field"), DENIED, ids=[d[0] for d in DENIED])
def test_each_baseline_violation_is_denied_naming_its_field(
    policy: dict[str, Any], what: str, edit: Callable[[dict[str, Any]], Any], field: str
) -> None:
    p = pod()
    edit(p)
    messages = request_denied(policy, p)
    assert len(messages) == 1, (what, messages)
    assert field in messages[0], (what, messages)
    # The same change made by an UPDATE of the pod's spec (an ephemeral container added) is denied too.
    if p["spec"] != pod()["spec"]:
        assert request_denied(policy, p, old=pod(), operation="UPDATE") == messages


def test_an_update_that_leaves_the_spec_alone_is_not_judged(policy: dict[str, Any]) -> None:
    # pod-security-admission admission.go isSignificantPodUpdate: a metadata-only update (a finalizer removed, a
    # label) of a pod admitted before the policy is let through, so such a pod can still be deleted.
    old = pod(hostNetwork=True)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    assert request_denied(policy, new, old=old, operation="UPDATE") == []


def test_a_privileged_debug_container_is_denied_on_the_ephemeralcontainers_subresource(policy: dict[str, Any]) -> None:
    old = pod()
    new = copy.deepcopy(old)
    ephemeral(new, securityContext={"privileged": True})
    messages = request_denied(policy, new, old=old, operation="UPDATE", sub_resource="ephemeralcontainers")
    assert len(messages) == 1
    assert "securityContext.privileged" in messages[0]


# Every pod template the manifests emit for the namespaces the policy binds.


def templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod template) of each pod a workload's controller creates from the object."""
    spec = doc.get("spec") or {}
    kind = doc["kind"]
    if kind in ("Job", "Deployment"):
        return [("template", spec["template"])]
    if kind == "RayJob":
        found = [(f"rayClusterSpec.{w}", t) for w, t in ray_templates(spec["rayClusterSpec"])]
        if "submitterPodTemplate" in spec:
            found.append(("submitterPodTemplate", spec["submitterPodTemplate"]))
        return found
    if kind == "RayCluster":
        return ray_templates(spec)
    return []


def ray_templates(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [("headGroupSpec", spec["headGroupSpec"]["template"])] + [
        (f"workerGroupSpecs[{g['groupName']}]", g["template"]) for g in spec.get("workerGroupSpecs", [])
    ]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_every_pod_the_manifests_make_in_the_bound_namespaces_is_admitted(dist: Path, env: str) -> None:
    docs = [d for path in sorted((dist / env).glob("*.k8s.yaml")) for d in yaml_documents(path.read_text()) if d]
    policy, _ = pod_policy(docs)
    pods = [
        (f"{d['kind']}/{d['metadata']['name']} {where}", d["metadata"]["namespace"], template)
        for d in docs
        if d["metadata"].get("namespace") in WORKLOAD_NAMESPACES
        for where, template in templates(d)
    ]
    kinds = {what.split("/")[0] for what, _, _ in pods}
    assert kinds == {"Job", "RayCluster", "RayJob"}, kinds
    added = set()
    for what, namespace, template in pods:
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**copy.deepcopy(template.get("metadata") or {}), "name": "p", "namespace": namespace},
            "spec": copy.deepcopy(template["spec"]),
        }
        assert request_denied(policy, obj) == [], what
        for c in obj["spec"]["containers"] + obj["spec"].get("initContainers", []):
            added |= set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
    # What the policy exists for: the EFA pods' IPC_LOCK, and nothing else beyond Baseline.
    assert added - set(BASELINE_CAPABILITIES) == {IPC_LOCK}

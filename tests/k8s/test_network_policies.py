"""NetworkPolicies (issue 38, "No pod reaches what is not its own"): every namespace the platform owns denies ingress
by default; a gang's pods admit each other on every port and nobody else; a Ray workload's pods admit each other, and
its head admits the RayJob's submitter and the KubeRay operator on the dashboard port only; Kueue's manager admits the
control plane on its webhook and visibility ports only.

These tests read the manifests' structure. The facts are spelled out here a second time on purpose (label keys and
values, ports), from their sources, so a change of the spec's constants still fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gates.manifests import check_objects
from infra.spec import ENVIRONMENTS
from rehearse.manifests import yaml_documents

POLICY_API = "networking.k8s.io/v1"
# Set by the API server on a Job's pod template (pkg/registry/batch/job/strategy.go generateSelector; validated by
# pkg/apis/batch/validation/validation.go validateGeneratedSelector): batch/v1 JobNameLabel.
JOB_NAME = "batch.kubernetes.io/job-name"
WORKLOAD = "platform/workload"
# KubeRay v1.7.0 ray-operator/controllers/ray/utils/constant.go; rayjob_controller.go getSubmitterTemplate.
NODE_TYPE = "ray.io/node-type"
SUBMITTER = {"ray.io/originated-from-cr-name": "{name}", "ray.io/originated-from-crd": "RayJob"}
# kuberay-operator chart 1.7.0 templates/deployment.yaml (nameOverride kuberay-operator, release kuberay-operator).
OPERATOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}},
    "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/instance": "kuberay-operator"}
    },
}
DASHBOARD = [{"protocol": "TCP", "port": 8265}]
DEFAULT_DENY = "default-deny-ingress"


def _documents(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, document)
        for path in sorted(directory.glob("*.yaml"))
        for document in yaml_documents(path.read_text())
        if document
    ]


def _policies(documents: list[tuple[str, dict[str, Any]]], file: str | None = None) -> list[dict[str, Any]]:
    return [d for f, d in documents if d["kind"] == "NetworkPolicy" and (file is None or f == file)]


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


def _is_default_deny(policy: dict[str, Any], namespace: str) -> bool:
    spec = policy["spec"]
    return (
        policy["metadata"].get("namespace") == namespace
        and spec["podSelector"] == {}
        and spec.get("policyTypes") == ["Ingress"]
        and not spec.get("ingress")
    )


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_every_namespace_in_the_manifests_denies_ingress_by_default(dist: Path, environment: str) -> None:
    documents = _documents(dist / environment)
    namespaces = [(f, d["metadata"]["name"]) for f, d in documents if d["kind"] == "Namespace"]
    assert namespaces
    for file, namespace in namespaces:
        # In the file that creates the namespace: no apply step can create one without the other.
        denies = [p for p in _policies(documents, file) if _is_default_deny(p, namespace)]
        assert [p["metadata"]["name"] for p in denies] == [DEFAULT_DENY], f"{file}: namespace {namespace}"


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_policies_restrict_ingress_only_and_name_tcp_ports_by_number(dist: Path, environment: str) -> None:
    policies = _policies(_documents(dist / environment))
    assert policies
    # The Kubernetes 1.36 schema, strictly (the manifests gate's rules).
    assert check_objects([(policy["metadata"]["name"], policy) for policy in policies]) == []
    for policy in policies:
        assert policy["apiVersion"] == POLICY_API
        assert policy["spec"]["policyTypes"] == ["Ingress"], policy["metadata"]["name"]
        assert "egress" not in policy["spec"]
        for rule in policy["spec"].get("ingress", []):
            assert rule["from"], "an empty `from` admits every source"
            for port in rule.get("ports", []):
                assert port["protocol"] == "TCP"
                assert isinstance(port["port"], int)


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_a_gangs_pods_admit_each_other_on_every_port_and_no_other_pod(dist: Path, environment: str) -> None:
    documents = _documents(dist / environment)
    jobs = [(f, d) for f, d in documents if d["kind"] == "Job"]
    assert {d["metadata"]["name"] for _, d in jobs} >= {"nvrx-fsdp"}
    for file, job in jobs:
        name = job["metadata"]["name"]
        pod_labels = {**job["spec"]["template"]["metadata"].get("labels", {}), JOB_NAME: name}
        mine = [p for p in _policies(documents, file) if p["spec"]["podSelector"] and _selects(p, pod_labels)]
        # One policy, in the Job's own file: the rendezvous (29500), the stores (29501-29502) and NCCL's bootstrap
        # and socket ports, which NCCL picks at run time, are open to the gang's own pods and to them only.
        assert [p["spec"] for p in mine] == [
            {
                "podSelector": {"matchLabels": {JOB_NAME: name}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {JOB_NAME: name}}}]}],
            }
        ], f"{file}: Job {name}"
    # No policy of the training namespace admits anything but a Job's own pods: not another Job's, not a pod
    # without the label, not another namespace's, not an address block.
    for policy in _policies(documents):
        if policy["metadata"]["namespace"] != "training":
            continue
        own = policy["spec"]["podSelector"]
        for rule in policy["spec"].get("ingress", []):
            assert rule["from"] == [{"podSelector": own}], policy["metadata"]["name"]


def _ray_workloads(documents: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f, d) for f, d in documents if d["kind"] in ("RayCluster", "RayJob")]


def _cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
    return spec


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_every_ray_pod_carries_the_label_its_policies_select(dist: Path, environment: str) -> None:
    # A RayJob's cluster is named `<rayjob>-<5 random characters>` (KubeRay v1.7.0 utils/util.go
    # GenerateRayClusterName), so no manifest can select it by ray.io/cluster; KubeRay copies the templates' labels
    # onto the pods (common/pod.go labelPod).
    workloads = _ray_workloads(_documents(dist / environment))
    assert {d["kind"] for _, d in workloads} == {"RayCluster", "RayJob"}
    for _, obj in workloads:
        spec = _cluster_spec(obj)
        for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
            assert group["template"]["metadata"]["labels"][WORKLOAD] == obj["metadata"]["name"]


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_a_ray_head_admits_the_submitter_and_the_operator_on_the_dashboard_port_only(
    dist: Path, environment: str
) -> None:
    documents = _documents(dist / environment)
    for file, obj in _ray_workloads(documents):
        name = obj["metadata"]["name"]
        own = {"matchLabels": {WORKLOAD: name}}
        head = {"matchLabels": {WORKLOAD: name, NODE_TYPE: "head"}}
        submitter = {"podSelector": {"matchLabels": {k: v.format(name=name) for k, v in SUBMITTER.items()}}}
        by_selector = {str(p["spec"]["podSelector"]): p["spec"] for p in _policies(documents, file)}
        assert by_selector[str(own)]["ingress"] == [{"from": [{"podSelector": own}]}]
        callers = [submitter, OPERATOR] if obj["kind"] == "RayJob" else [OPERATOR]
        assert by_selector[str(head)]["ingress"] == [{"from": [peer], "ports": DASHBOARD} for peer in callers]
        assert set(by_selector) == {str(own), str(head)}, file


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_nothing_outside_a_ray_workload_reaches_gcs_or_the_client_port(dist: Path, environment: str) -> None:
    # GCS (6379) and the Ray client (10001) serve the cluster's own pods; the submitter and the operator use the
    # dashboard's HTTP job API (KubeRay v1.7.0 common/job.go, utils/util.go GetRayDashboardClientFunc), trainctl
    # `exec`s into the head (trainctl/kube.py).
    for policy in _policies(_documents(dist / environment)):
        if policy["metadata"]["namespace"] != "ray" or not policy["spec"].get("ingress"):
            continue  # the default deny
        own = {"matchLabels": {WORKLOAD: policy["spec"]["podSelector"]["matchLabels"][WORKLOAD]}}
        for rule in policy["spec"]["ingress"]:
            if rule["from"] != [{"podSelector": own}]:
                assert rule["ports"] == DASHBOARD, policy["metadata"]["name"]


def test_the_namespaces_cdk_applies_carry_their_policies() -> None:
    from infra.spec.kueue import KUEUE
    from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM, FABRIC_GATE_SYSTEM, KUBERAY, RAY, TRAINING
    from infra.spec.network_policies import namespace_objects

    for spec in (RAY, TRAINING, KUBERAY, KUEUE, FABRIC_GATE_SYSTEM, CAPACITY_HOLD_SYSTEM):
        objects = namespace_objects(spec, "dev", vpc_cidr="10.10.0.0/16")
        assert objects[0]["kind"] == "Namespace"
        assert [o["metadata"]["name"] for o in objects[1:] if _is_default_deny(o, spec.name)] == [DEFAULT_DENY]
        extra = [o for o in objects[1:] if not _is_default_deny(o, spec.name)]
        # Only Kueue serves the control plane: its webhooks (charts/kueue values.yaml webhook.port 9443) and the
        # visibility API's APIService (templates/visibility/service.yaml targetPort 8082), at v0.19.2. The KubeRay
        # chart 1.7.0 has no webhook; the fabric gate's and the hold controller serve nothing.
        if spec is not KUEUE:
            assert extra == [], spec.name
            continue
        (policy,) = extra
        assert policy["spec"] == {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "kueue",
                    "app.kubernetes.io/instance": "kueue",
                    "control-plane": "controller-manager",
                }
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"ipBlock": {"cidr": "10.10.0.0/16"}}],
                    "ports": [{"protocol": "TCP", "port": 9443}, {"protocol": "TCP", "port": 8082}],
                }
            ],
        }


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rules": "no peers"}, "from"),
        ({"rules": "open"}, "cidr"),
        ({"rules": "port 0"}, "ports"),
        ({"name": "Not_A_Name"}, "name"),
        ({"rules": "both"}, "from"),
    ],
)
def test_the_spec_refuses_a_policy_that_admits_more_than_it_says(change: dict[str, str], field: str) -> None:
    from infra.spec.errors import ConfigError
    from infra.spec.network_policies import IngressRule, Peer, PolicySpec

    def rules() -> tuple[IngressRule, ...]:
        kind = change.get("rules")
        if kind == "no peers":
            return (IngressRule(peers=(), why="x"),)
        if kind == "open":
            return (IngressRule(peers=(Peer(cidr="0.0.0.0/0"),), why="x"),)
        if kind == "port 0":
            return (IngressRule(peers=(Peer(pods={"a": "b"}),), ports=(0,), why="x"),)
        if kind == "both":
            return (IngressRule(peers=(Peer(pods={"a": "b"}, cidr="10.0.0.0/16"),), why="x"),)
        return ()

    with pytest.raises(ConfigError) as raised:
        PolicySpec(name=change.get("name", "p"), namespace="ray", pods={}, rules=rules(), why="x")
    assert field in raised.value.field

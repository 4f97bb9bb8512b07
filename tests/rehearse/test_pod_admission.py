"""Issue 38: the files' ValidatingAdmissionPolicies that match Pod CREATE judge every pod the rehearsal's controllers
create (rehearse/pod_admission.py), with or without --env: a pod the namespaces' Baseline-plus-IPC_LOCK policy
(k8s/charts/pod_security.py) denies is never created and its workload ends FailedCreate with the API server's
answer, while the rest of the run goes on; a pod it admits, or one outside the bound namespaces, runs. On the fake
runtime, in milliseconds (the policy's CEL is compiled once per run)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rehearse import RehearsalError
from rehearse.cluster.authz import Policies, User
from rehearse.cluster.matching import label_selector_matches
from rehearse.fake import FakeRuntime, Script, rehearse_fake
from rehearse.loop import prepare
from rehearse.options import Options
from rehearse.pod_admission import PodAdmission, creator, pod_object
from rehearse.pods import PodPlan
from tests.k8s.namespaces_chart import namespaces_chart_objects

POLICY = "pod-security-baseline-ipc-lock"
EFA: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}


def namespaces() -> list[dict[str, Any]]:
    """The namespaces' file of the charts: the ray and training Namespaces, their NetworkPolicies and pod policy."""
    return namespaces_chart_objects()


def job(name: str, namespace: str = "training", **security: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.14-slim", "command": ["true"], "securityContext": security}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def ray_cluster(name: str, **worker_spec: Any) -> dict[str, Any]:
    def group(container: str, **spec: Any) -> dict[str, Any]:
        pod = {"containers": [{"name": container, "image": "rayproject/ray:2.58.0", "securityContext": EFA}], **spec}
        return {"rayStartParams": {}, "template": {"spec": pod}}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "ray"},
        "spec": {
            "headGroupSpec": group("ray-head"),
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, **group("ray-worker", **worker_spec)}],
        },
    }


def test_a_pod_the_policy_denies_is_not_created_and_its_job_ends_failed_create() -> None:
    runtime = FakeRuntime()
    result = rehearse_fake([*namespaces(), job("bad", privileged=True, **copy.deepcopy(EFA))], runtime)
    bad = result.workload("bad")
    assert bad.state == "FailedCreate"
    assert bad.message.startswith('pods "bad-')
    assert f"is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request" in bad.message
    assert "securityContext.privileged" in bad.message
    assert runtime.pods == {}  # nothing of it was created
    assert bad.pods == []
    assert any("retries the create" in n for n in bad.notes)
    assert result.exit_code == 1


def test_ipc_lock_alone_runs_and_the_policy_is_noted_not_skipped() -> None:
    result = rehearse_fake([*namespaces(), job("efa", **copy.deepcopy(EFA))])
    assert result.workload("efa").state == "Complete"
    assert result.exit_code == 0
    assert f"ValidatingAdmissionPolicy/{POLICY} (binding {POLICY}) judges every pod the controllers create" in (
        result.notes
    )
    assert not [n for n in result.notes if n.startswith("skipped ValidatingAdmissionPolicy")]


def test_a_pod_outside_the_bound_namespaces_is_not_judged() -> None:
    result = rehearse_fake([*namespaces(), job("elsewhere", namespace="svc", privileged=True)])
    assert result.workload("elsewhere").state == "Complete"


def test_a_denied_worker_ends_its_ray_cluster_and_the_run_goes_on() -> None:
    # The head is created first (KubeRay creates it before the workers); the first worker is denied (hostNetwork):
    # the head the controller made is deleted with it, and the Job beside it still completes.
    runtime = FakeRuntime({"other": [Script(after_s=5)]})
    manifests = [*namespaces(), ray_cluster("rc", hostNetwork=True), job("other", **copy.deepcopy(EFA))]
    result = rehearse_fake(manifests, runtime, tick_s=1.0)
    rc = result.workload("rc")
    assert rc.state == "FailedCreate", rc.message
    assert "spec.hostNetwork" in rc.message
    assert "rc-gpu-worker-" in rc.message
    (head,) = [p for p in runtime.pods.values() if p.name.startswith("rc-")]  # no worker was created
    assert head.name.startswith("rc-head-")
    assert not head.running
    assert result.workload("other").state == "Complete"


def test_the_pod_object_is_what_its_controller_creates() -> None:
    plan = PodPlan(
        name="rc-head-x",
        namespace="ray",
        spec={"containers": [{"name": "ray-head", "image": "i"}]},
        workload="RayCluster/rc",
        labels={"ray.io/node-type": "head"},
        unrun_containers=[{"name": "autoscaler", "image": "i"}],
        owner_references=[{"kind": "RayCluster", "name": "rc", "controller": True}],
    )
    obj = pod_object(plan)
    assert [c["name"] for c in obj["spec"]["containers"]] == ["ray-head", "autoscaler"]
    assert obj["metadata"]["labels"] == {"ray.io/node-type": "head"}
    assert plan.spec["containers"] == [{"name": "ray-head", "image": "i"}]  # the plan is left alone
    assert creator(plan) == User.service_account("kuberay-system", "kuberay-operator")


def test_prepare_judges_with_the_files_policies_only() -> None:
    assert prepare([job("plain")], Options()).pod_admission is not None
    assert PodAdmission([job("plain")]).judging == []
    assert [p.name for p in PodAdmission(namespaces()).judging] == [POLICY]


SELECTOR = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ray"]}]}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {}, True),
        (SELECTOR, {"kubernetes.io/metadata.name": "ray"}, True),
        (SELECTOR, {"kubernetes.io/metadata.name": "training"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {"a": "x"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    ],
)
def test_label_selectors_as_kubernetes_evaluates_them(
    selector: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert label_selector_matches(selector, labels) is expected


def policy_and_binding(**binding_spec: Any) -> list[dict[str, Any]]:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "p"},
            "spec": {
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [{"expression": "false", "message": "never"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "b"},
            "spec": {"policyName": "p", "validationActions": ["Deny"], **binding_spec},
        },
    ]


def test_a_namespace_selector_never_skips_a_cluster_scoped_request() -> None:
    policies = Policies(policy_and_binding(matchResources={"namespaceSelector": SELECTOR}))
    user = User("kubernetes-admin", ())
    denial = policies.denied(user, operation="UPDATE", group="", version="v1", resource="nodes", obj={}, old={})
    assert denial is not None
    assert denial.endswith("never")


def test_what_a_binding_selects_on_beyond_namespaces_is_refused_naming_it() -> None:
    with pytest.raises(RehearsalError, match=r"matchResources: objectSelector is not emulated"):
        Policies(policy_and_binding(matchResources={"objectSelector": {}}))
    with pytest.raises(RehearsalError, match=r"operator 'Gt' is not a label selector operator"):
        Policies(
            policy_and_binding(
                matchResources={"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}
            )
        )

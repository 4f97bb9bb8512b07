"""The manifest gate: real manifests pass; each broken one fails with its reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gates.manifests import check_objects

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0@{DIGEST}"
RESOURCES = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "3", "memory": "12Gi"}}


def _messages(obj: dict[str, Any]) -> list[str]:
    return [f.message for f in check_objects([("x.yaml#0", obj)])]


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "training"},
        "spec": {"containers": [{"name": "c", "image": IMAGE, "resources": RESOURCES, **container}]},
    }


def _ray_cluster() -> dict[str, Any]:
    container = {"name": "ray-head", "image": IMAGE, "resources": RESOURCES}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "ray"},
        "spec": {
            "headGroupSpec": {"rayStartParams": {"num-gpus": "0"}, "template": {"spec": {"containers": [container]}}},
        },
    }


def test_valid_pod_and_ray_cluster_pass() -> None:
    assert _messages(_pod()) == []
    assert _messages(_ray_cluster()) == []


@pytest.mark.parametrize("image", ["rayproject/ray:2.58.0", "rayproject/ray", f"rayproject/ray@sha256:{'ab' * 31}"])
def test_unpinned_image_fails(image: str) -> None:
    messages = _messages(_pod(image=image))
    assert len(messages) == 1
    assert "image not pinned by digest" in messages[0]
    assert repr(image) in messages[0]


def test_unpinned_image_inside_a_ray_cluster_fails() -> None:
    rc = _ray_cluster()
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = "rayproject/ray:2.58.0"
    assert any("headGroupSpec.template.spec.containers[0](ray-head)" in m for m in _messages(rc))


def test_container_without_limits_fails() -> None:
    messages = _messages(_pod(resources={"requests": {"cpu": "1", "memory": "1Gi"}}))
    assert messages == ["container at .spec.containers[0](c) has no limits for cpu, memory"]


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_exposed_service_fails(service_type: str) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"type": service_type, "ports": [{"port": 8265}]},
    }
    assert _messages(svc) == [f"Service of type {service_type}: nothing may be exposed outside the cluster"]


def test_exposed_ray_head_fails() -> None:
    rc = _ray_cluster()
    rc["spec"]["headGroupSpec"]["serviceType"] = "LoadBalancer"
    assert "Ray head serviceType LoadBalancer" in " ".join(_messages(rc))


def test_namespace_without_pod_security_labels_fails() -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "labels": {}}}
    assert _messages(ns) == [
        f"namespace without a valid pod-security.kubernetes.io/{mode} label" for mode in ("enforce", "warn", "audit")
    ]


def test_core_schema_violation_fails() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    messages = _messages(pod)
    assert len(messages) == 1
    assert "does not match the Kubernetes 1.36 schema at spec.containers.0.ports.0.containerPort" in messages[0]


def test_unknown_core_field_fails_strictly() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["resource"] = {}  # typo: the API server would drop it silently
    assert any("does not match the Kubernetes 1.36 schema" in m for m in _messages(pod))


def test_ray_crd_schema_violation_fails() -> None:
    rc = _ray_cluster()
    broken = copy.deepcopy(rc)
    broken["spec"]["headGroupSpec"]["rayStartParams"] = {"num-gpus": 0}  # must be strings
    assert any(
        "RayCluster does not match the KubeRay 1.7.0 CRD at spec.headGroupSpec.rayStartParams.num-gpus" in m
        for m in _messages(broken)
    )
    typo = copy.deepcopy(rc)
    typo["spec"]["headGroupSpec"]["rayStartParam"] = {}
    assert any("Additional properties are not allowed ('rayStartParam'" in m for m in _messages(typo))


def test_unknown_kind_fails() -> None:
    obj = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert any("no Kubernetes 1.36 schema" in m for m in _messages(obj))


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _policy(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny-ingress", "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], **spec},
    }


def _isolation(sources: dict[str, list[dict[str, Any]]]) -> list[str]:
    from gates.manifests import check_namespace_isolation

    return [
        f"{f.where}: {f.message}"
        for f in check_namespace_isolation(
            {s: [(f"{s}#{i}", o) for i, o in enumerate(objs)] for s, objs in sources.items()}
        )
    ]


def test_a_namespace_with_its_default_deny_passes() -> None:
    assert _isolation({"dev": [_namespace("ray"), _policy("ray")]}) == []


@pytest.mark.parametrize(
    "policy",
    [
        None,
        _policy("training"),  # another namespace's
        _policy("ray", podSelector={"matchLabels": {"app": "x"}}),  # some pods only
        _policy("ray", policyTypes=["Egress"]),  # not ingress
        _policy("ray", ingress=[{"from": [{"podSelector": {}}]}]),  # admits the namespace's pods
    ],
    ids=["none", "other-namespace", "some-pods", "egress-only", "with-rules"],
)
def test_a_namespace_without_a_default_deny_ingress_fails(policy: dict[str, Any] | None) -> None:
    objects = [_namespace("ray"), *([policy] if policy else [])]
    assert _isolation({"dev": objects}) == [
        "dev#0: namespace ray has no default-deny ingress NetworkPolicy (podSelector {}, policyTypes with Ingress, "
        "no ingress rules) where it is created: infra/spec/network_policies.py namespace_objects"
    ]


def test_the_default_deny_must_come_with_the_namespace_not_from_elsewhere() -> None:
    # A template that creates the namespace and a dist/ file set that carries its policy: the template's apply
    # creates a namespace open to every pod.
    template = "assembly-dev/Platform.template.json"
    (found,) = _isolation({template: [_namespace("kueue-system")], "dev": [_policy("kueue-system")]})
    assert found.startswith(f"{template}#0: namespace kueue-system")

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

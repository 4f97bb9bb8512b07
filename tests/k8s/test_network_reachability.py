"""Who reaches whom under the emitted NetworkPolicies, for the pods the workloads really get: every pod the
rehearsal's controllers (Job, KubeRay, Deployment) create from an environment's dist/ files on the fake runtime,
with their controllers' labels, judged by rehearse/network_policy.py (the decision the rehearsal enforces on real
pods: tests/rehearse/test_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS
from rehearse.fake import FakeRuntime, Script, rehearse_fake
from rehearse.manifests import yaml_documents
from rehearse.network_policy import EVERY_PORT, Endpoint, Policies, PortRange
from rehearse.pods import KUBERAY_OPERATOR, Pod

WORKLOAD_FILES = ("nvrx-fsdp.k8s.yaml", "fabric-check.k8s.yaml", "ray-finetune.k8s.yaml", "ray-cluster.k8s.yaml")
DASHBOARD = (PortRange("TCP", 8265, 8265),)


def _pods(directory: Path) -> tuple[Policies, list[Pod]]:
    objects: list[dict[str, Any]] = []
    for name in ("namespaces.k8s.yaml", "training-code.k8s.yaml", *WORKLOAD_FILES):
        objects += [o for o in yaml_documents((directory / name).read_text()) if o]
    runtime = FakeRuntime({"": [Script(after_s=5)]})

    def dashboard(head: Pod, path: str, now: float) -> dict[str, Any]:
        cluster = head.plan.labels["ray.io/cluster"]
        alive = [p for p in runtime.pods.values() if p.running and p.plan.labels.get("ray.io/cluster") == cluster]
        return {"data": {"summary": [{"raylet": {"state": "ALIVE"}} for _ in alive]}, "status": "SUCCEEDED"}

    runtime.dashboard = dashboard
    rehearse_fake(objects, runtime, timeout_s=30.0)
    return Policies.of(objects), list(runtime.pods.values())


def _endpoint(pod: Pod) -> Endpoint:
    return Endpoint(pod.plan.name, pod.plan.namespace, pod.plan.labels, f"10.0.0.{len(pod.plan.name)}")


def _expected(source: Pod, destination: Pod) -> tuple[PortRange, ...]:
    s, d = source.plan.labels, destination.plan.labels
    if source is destination:
        return EVERY_PORT
    if destination.plan.namespace not in ("training", "ray"):
        return EVERY_PORT if destination.plan.namespace not in ("fabric-gate-system",) else ()
    if source.plan.namespace == destination.plan.namespace:
        gang = "batch.kubernetes.io/job-name"
        if destination.plan.namespace == "training" and s.get(gang) == d.get(gang) is not None:
            return EVERY_PORT
        if s.get("platform/workload") is not None and s.get("platform/workload") == d.get("platform/workload"):
            return EVERY_PORT
        submits_to = s.get("ray.io/originated-from-cr-name")
        if submits_to and d.get("ray.io/node-type") == "head" and d.get("platform/workload") == submits_to:
            return DASHBOARD
    return ()


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_each_pod_reaches_its_own_gang_the_submitter_its_head_and_nothing_else(dist: Path, environment: str) -> None:
    policies, pods = _pods(dist / environment)
    kinds = {p.plan.workload.split("/")[0] for p in pods}
    assert {"Job", "RayJob", "RayCluster", "Deployment"} <= kinds, kinds
    assert any(p.plan.labels.get("ray.io/originated-from-crd") == "RayJob" for p in pods), "no submitter was created"
    wrong = [
        (s.plan.name, d.plan.name, policies.admitted(_endpoint(s), _endpoint(d)), _expected(s, d))
        for s in pods
        for d in pods
        if policies.admitted(_endpoint(s), _endpoint(d)) != _expected(s, d)
    ]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_the_operator_reaches_every_head_on_the_dashboard_only_and_a_stranger_reaches_no_pod(
    dist: Path, environment: str
) -> None:
    policies, pods = _pods(dist / environment)
    heads = [p for p in pods if p.plan.labels.get("ray.io/node-type") == "head"]
    assert {h.plan.labels["platform/workload"] for h in heads} == {"qwen-finetune", "training"}
    for pod in pods:
        expected = DASHBOARD if pod in heads else ()
        assert policies.admitted(KUBERAY_OPERATOR, _endpoint(pod)) == expected, pod.plan.name
        for stranger in (
            Endpoint("s", "default", {}, "10.1.0.1"),
            Endpoint("s", pod.plan.namespace, {}, "10.1.0.2"),
            Endpoint("s", pod.plan.namespace, {"app.kubernetes.io/created-by": "kuberay-operator"}, "10.1.0.3"),
        ):
            assert policies.admitted(stranger, _endpoint(pod)) == (), (stranger, pod.plan.name)

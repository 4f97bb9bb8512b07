"""A Deployment as the Kubernetes 1.36 Deployment and ReplicaSet controllers run it (rehearse/deployment.py), on the
fake runtime: its replicas' pods from the template (named `<deployment>-<pod-template-hash>-<5 random>`, labelled
with the hash, owned by the ReplicaSet), Ready once they run, a lost pod replaced, long-lived until the finite
workloads end. Fixtures after the docs' nginx-deployment.yaml (concepts/workloads/controllers/deployment)."""

from __future__ import annotations

from typing import Any

import pytest

from rehearse import RehearsalError
from rehearse.deployment import TEMPLATE_HASH_LABEL
from rehearse.fake import FakeRuntime, Script, rehearse_fake
from rehearse.options import Kill

NS = "svc"


def deployment(replicas: int = 1, **meta: Any) -> dict[str, Any]:
    labels = {"app": "svc"}
    container = {"name": "main", "image": "python:3.14-slim", "command": ["python", "-m", "svc"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "svc", "namespace": NS, **meta},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def job() -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.14-slim", "command": ["true"]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "work", "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def test_a_deployment_runs_its_replicas_until_the_finite_workloads_end_and_is_reported_ready() -> None:
    runtime = FakeRuntime({"work": [Script(after_s=30)]})
    result = rehearse_fake([deployment(replicas=2), job()], runtime, tick_s=1.0)
    svc = result.workload("svc")
    assert (svc.state, result.workload("work").state) == ("Ready", "Complete"), svc.message
    assert "Available: 2/2 replicas" in svc.message
    assert result.exit_code == 0
    (a, b) = svc.pods
    replica_set = a.name.rsplit("-", 1)[0]
    assert replica_set.startswith("svc-")
    assert b.name.rsplit("-", 1)[0] == replica_set
    assert a.labels[TEMPLATE_HASH_LABEL] == replica_set.removeprefix("svc-")
    pods = runtime.pods
    assert pods[a.name].plan.owner_references == [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": replica_set,
            "uid": pods[a.name].plan.owner_references[0]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    # The API server defaults restartPolicy to Always: the kubelet restarts the container in place.
    assert pods[a.name].plan.spec["restartPolicy"] == "Always"
    # Stopped by the run's end, not ended on its own.
    assert all(p.phase != "Succeeded" for p in svc.pods)


def test_a_lost_deployment_pod_is_replaced_by_its_replicaset() -> None:
    runtime = FakeRuntime({"work": [Script(after_s=60)]})
    result = rehearse_fake([deployment(), job()], runtime, tick_s=1.0, kills=(Kill(pod="svc-", seconds=10),))
    svc = result.workload("svc")
    assert len(svc.pods) == 2, [(p.name, p.phase) for p in svc.pods]
    assert any("ReplicaSet svc-" in n and "created" in n for n in svc.notes), svc.notes
    assert svc.state == "Ready"


def test_a_deployment_kueue_would_manage_is_refused_naming_the_label() -> None:
    with pytest.raises(RehearsalError, match=r"kueue\.x-k8s\.io/queue-name: a Deployment managed by Kueue"):
        rehearse_fake([deployment(labels={"kueue.x-k8s.io/queue-name": "q"}), job()])


def test_a_selector_that_does_not_match_the_template_is_refused_as_the_api_server_does() -> None:
    bad = deployment()
    bad["spec"]["selector"]["matchLabels"] = {"app": "other"}
    with pytest.raises(RehearsalError, match="`selector` does not match template `labels`"):
        rehearse_fake([bad, job()])

"""The controller's loop against a loopback API server (tests/fabric_controller/objects_api.py) and the gate's own
client (training/fabric_gate.py report_own_node): claim, checks, taint, quota, Events, answer, release."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fabric_controller.config import ControllerConfig, GroupConfig
from fabric_controller.loop import Controller
from tests.fabric_controller.objects_api import ObjectsApi, serving
from training.fabric_gate import GateVerdict, NodeOutcome, Outcome, RankTransport, report_own_node
from training.fabric_verdict import (
    REFUSED_REASON,
    RELEASED_REASON,
    TAINT_KEY,
    TAKEN_ANNOTATION,
    TAKEN_REASON,
    VERDICT_REASON,
)
from training.kube_api import KubeApi

G6 = GroupConfig("g6", "gpu-g6", "gpu-g6", {"cpu": "44", "nvidia.com/gpu": "4"})
CONFIG = ControllerConfig(("ray", "training"), {"g6": G6}, poll_s=0.05)
CQ = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6"
VERDICT = GateVerdict(
    Outcome.FAIL,
    ("1 of 2 rank(s) are not on EFA",),
    nodes=("node-a", "node-b"),
    failing=(RankTransport(0, "h", "node-a", "socket", "NET/Socket"),),
    suspects=("node-a",),
)


def owner(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def add_node(api: ObjectsApi, name: str) -> None:
    labels = {"role": "gpu-worker", "platform/gpu-group": "g6"}
    api.put(f"/api/v1/nodes/{name}", {"kind": "Node", "metadata": {"name": name, "uid": f"u-{name}", "labels": labels}})


def add_pod(api: ObjectsApi, ns: str, name: str, node: str, owners: list[dict[str, Any]]) -> None:
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "ownerReferences": owners}
    api.put(
        f"/api/v1/namespaces/{ns}/pods/{name}",
        {"kind": "Pod", "metadata": meta, "spec": {"nodeName": node}, "status": {"phase": "Running"}},
    )


def add_workload(api: ObjectsApi, ns: str, job_uid: str, admitted: bool = True) -> None:
    status = "True" if admitted else "False"
    api.put(
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads/wl-{job_uid}",
        {
            "kind": "Workload",
            "metadata": {"name": f"wl-{job_uid}", "labels": {"kueue.x-k8s.io/job-uid": job_uid}},
            "status": {"conditions": [{"type": "Admitted", "status": status}]},
        },
    )


@pytest.fixture
def cluster() -> Iterator[ObjectsApi]:
    api = ObjectsApi()
    for name in ("node-a", "node-b", "node-c"):
        add_node(api, name)
    api.put(
        "/apis/batch/v1/namespaces/training/jobs/nvrx-fsdp",
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nvrx-fsdp", "uid": "job-uid"}},
    )
    add_workload(api, "training", "job-uid")
    job = owner("batch/v1", "Job", "nvrx-fsdp", "job-uid")
    add_pod(api, "training", "nvrx-fsdp-0", "node-a", [job])
    add_pod(api, "training", "nvrx-fsdp-1", "node-b", [job])
    flavor = {
        "name": "gpu-g6",
        "resources": [{"name": "cpu", "nominalQuota": "132"}, {"name": "nvidia.com/gpu", "nominalQuota": "12"}],
    }
    api.put(
        CQ,
        {"kind": "ClusterQueue", "metadata": {"name": "gpu-g6"}, "spec": {"resourceGroups": [{"flavors": [flavor]}]}},
    )
    with serving(api):
        yield api


def pod_env(ns: str, pod: str, node: str) -> dict[str, str]:
    return {"NODE_NAME": node, "POD_NAME": pod, "POD_UID": f"uid-{pod}", "POD_NAMESPACE": ns}


def claim_while_controller_runs(
    api: ObjectsApi, controller: Controller, ns: str, pod: str, node: str, workload: str
) -> NodeOutcome:
    """The gate's pod posts its verdict and waits; the controller polls meanwhile, as in the cluster."""
    result: list[NodeOutcome] = []
    client = KubeApi(api.url, "t")
    waiter = threading.Thread(
        target=lambda: result.append(
            report_own_node(VERDICT, client, workload=workload, environ=pod_env(ns, pod, node), wait_s=10, poll_s=0.05)
        )
    )
    waiter.start()
    while waiter.is_alive():
        controller.tick()
        waiter.join(0.05)
    return result[0]


def quota(api: ObjectsApi) -> list[str]:
    (group,) = api.objects[CQ]["spec"]["resourceGroups"]
    return [r["nominalQuota"] for r in group["flavors"][0]["resources"]]


def taints(api: ObjectsApi, node: str) -> list[dict[str, str]]:
    return (api.objects[f"/api/v1/nodes/{node}"].get("spec") or {}).get("taints") or []


def test_a_gang_member_reports_its_node_and_the_controller_takes_it_out(cluster: ObjectsApi) -> None:
    controller = Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None)
    outcome = claim_while_controller_runs(cluster, controller, "training", "nvrx-fsdp-0", "node-a", "Job/nvrx-fsdp")

    assert outcome.taken, outcome
    assert outcome.workload_uid == "job-uid"
    assert taints(cluster, "node-a") == [{"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"}]
    assert taints(cluster, "node-b") == []
    assert quota(cluster) == ["88", "8"]
    record = json.loads(cluster.objects[CQ]["metadata"]["annotations"][TAKEN_ANNOTATION])
    assert record["nodes"]["node-a"]["workload"] == "training/Job/nvrx-fsdp"
    taken = {(e["metadata"]["namespace"], e["involvedObject"]["kind"]) for e in cluster.events(TAKEN_REASON)}
    assert taken == {("default", "Node"), ("training", "Job"), ("training", "Pod")}
    (job_event,) = [e for e in cluster.events(TAKEN_REASON) if e["involvedObject"]["kind"] == "Job"]
    assert job_event["involvedObject"]["uid"] == "job-uid"
    assert "kubectl taint node node-a platform/fabric-gate:NoSchedule-" in job_event["message"]

    # Answered once: more polls, and a restarted controller, change nothing.
    controller.tick()
    Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None).tick()
    assert len(cluster.events(TAKEN_REASON)) == 3
    assert quota(cluster) == ["88", "8"]


def test_a_pod_of_no_admitted_gang_is_refused_and_nothing_changes(cluster: ObjectsApi) -> None:
    add_pod(cluster, "training", "stranger", "node-c", [])
    controller = Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None)
    outcome = claim_while_controller_runs(cluster, controller, "training", "stranger", "node-c", "Job/nvrx-fsdp")

    assert not outcome.taken
    assert "not a member of an admitted gang" in outcome.text
    assert taints(cluster, "node-c") == []
    assert quota(cluster) == ["132", "12"]
    assert [e["involvedObject"]["name"] for e in cluster.events(REFUSED_REASON)] == ["stranger"]


def test_a_pod_claiming_another_node_is_refused(cluster: ObjectsApi) -> None:
    controller = Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None)
    outcome = claim_while_controller_runs(cluster, controller, "training", "nvrx-fsdp-1", "node-a", "Job/nvrx-fsdp")
    assert not outcome.taken
    assert "runs on node-b, not on node-a" in outcome.text
    assert taints(cluster, "node-a") == []


def test_no_controller_means_no_answer_and_nothing_taken(cluster: ObjectsApi) -> None:
    env = pod_env("training", "nvrx-fsdp-0", "node-a")
    outcome = report_own_node(
        VERDICT, KubeApi(cluster.url, "t"), workload="Job/x", environ=env, wait_s=0.2, poll_s=0.05
    )
    assert not outcome.taken
    assert "no answer from the remediation controller" in outcome.text
    assert len(cluster.events(VERDICT_REASON)) == 1


def test_a_ray_worker_speaks_for_its_node_and_the_failures_count_against_the_rayjob_uid(cluster: ObjectsApi) -> None:
    cluster.put(
        "/apis/ray.io/v1/namespaces/ray/rayjobs/qwen",
        {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "qwen", "uid": "rayjob-uid"}},
    )
    cluster.put(
        "/apis/ray.io/v1/namespaces/ray/rayclusters/qwen-x1",
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {
                "name": "qwen-x1",
                "uid": "rc-uid",
                "ownerReferences": [owner("ray.io/v1", "RayJob", "qwen", "rayjob-uid")],
            },
        },
    )
    add_workload(cluster, "ray", "rayjob-uid")
    add_pod(cluster, "ray", "qwen-x1-g6-worker-1", "node-c", [owner("ray.io/v1", "RayCluster", "qwen-x1", "rc-uid")])
    controller = Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None)
    outcome = claim_while_controller_runs(cluster, controller, "ray", "qwen-x1-g6-worker-1", "node-c", "RayJob/qwen")
    assert outcome.taken, outcome
    assert outcome.workload_uid == "rayjob-uid"
    (ray_job_event,) = [e for e in cluster.events(TAKEN_REASON) if e["involvedObject"]["kind"] == "RayJob"]
    assert ray_job_event["involvedObject"]["uid"] == "rayjob-uid"


def test_a_released_node_gives_its_quota_back(cluster: ObjectsApi) -> None:
    controller = Controller(KubeApi(cluster.url, "controller"), CONFIG, log=lambda _: None)
    claim_while_controller_runs(cluster, controller, "training", "nvrx-fsdp-0", "node-a", "Job/nvrx-fsdp")
    assert quota(cluster) == ["88", "8"]
    controller.tick()
    assert quota(cluster) == ["88", "8"]  # still tainted: nothing given back

    node = cluster.objects["/api/v1/nodes/node-a"]
    node["spec"]["taints"] = []  # an operator's kubectl taint node node-a platform/fabric-gate:NoSchedule-
    controller.tick()
    assert quota(cluster) == ["132", "12"]
    assert json.loads(cluster.objects[CQ]["metadata"]["annotations"][TAKEN_ANNOTATION])["nodes"] == {}
    assert [e["involvedObject"]["name"] for e in cluster.events(RELEASED_REASON)] == ["node-a"]
    controller.tick()
    assert quota(cluster) == ["132", "12"]  # once

"""The fabric gate's chain on the fake runtime (no processes, a fake clock): the emitted FabricGate objects (the
identities, the controller's Deployment and its config) on prod's cluster with 3 g6 nodes, a gang admitted by the
Kueue model, and the rehearsal's API server (rehearse/cluster/apiserver.py) on 127.0.0.1. Mid-run, a pod posts a
verdict Event on itself with its own token (what training/fabric_gate.py report_own_node posts) and the real
remediation controller (fabric_controller.loop.Controller, its config read from the emitted ConfigMap) takes one
poll with the Deployment pod's token; the gate's own wait_for_answer reads the answer. What the controller reads (the
pod, its Job, the Kueue Workload by job uid, the nodes, the ClusterQueue) is the run's, through the API's routes.

The process-level rehearsal (test_fabric_gate_rehearsal.py) runs the same chain with real pods and the controller
as a pod of the Deployment; this one shows the decisions and the cluster's side in milliseconds: a verdict from a
pod outside the admitted gang, or about another node, is refused through the API and changes nothing; a gang pod's
verdict taints its node, lowers the ClusterQueue (and so the Kueue model's quota) by one node, and the Job's
replacements are placed off the node while Kueue keeps the admission."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cdk8s
import pytest

from fabric_controller.config import ControllerConfig
from fabric_controller.loop import Controller
from infra.spec import ENVIRONMENTS
from k8s.charts.fabric_gate import CONFIG_CONFIGMAP
from k8s.charts.ray import RayJobChart
from k8s.images import ImageLock
from k8s.workloads import RayFinetuneJob
from rehearse.cluster.session import ClusterSession, annotate, cluster_options
from rehearse.fake import Dashboard, FakeRuntime, Script
from rehearse.loop import drive, prepare
from rehearse.network import LoopbackNetwork
from rehearse.options import Options
from rehearse.outcome import Rehearsal
from rehearse.pods import Pod, object_uid
from tests.rehearse.cluster.test_apiserver import gate_objects
from tests.rehearse.cluster.test_cluster_loop import GPU_POD, gpu_job, ray_dashboard
from tests.rehearse.test_kuberay_controllers import failing_first
from training.fabric_gate import SERVICE_ACCOUNT, wait_for_answer
from training.fabric_verdict import TAINT_KEY, Answer, ReportedVerdict
from training.kube_api import API_TOKEN_ENV, KubeApi

GATE = "system:serviceaccount:training:fabric-gate"
CONTROLLER = "system:serviceaccount:fabric-gate-system:fabric-gate-controller"
RETRY = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}}]}


def gang() -> dict[str, Any]:
    job = gpu_job("gang", podFailurePolicy=RETRY)
    job["spec"]["template"]["spec"]["serviceAccountName"] = SERVICE_ACCOUNT
    return job


def intruder() -> dict[str, Any]:
    """A Job Kueue does not manage (no queue label) whose pod runs on a g6 node with the gated pods' identity."""
    container: dict[str, Any] = {"name": "main", "image": "example.invalid/x:1", "command": ["true"]}
    container["resources"] = {"requests": {"cpu": "1"}}
    spec = {"restartPolicy": "Never", "serviceAccountName": SERVICE_ACCOUNT, "containers": [container], **GPU_POD}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "intruder", "namespace": "training"},
        "spec": {"backoffLimit": 0, "template": {"spec": spec}},
    }


class Midway(FakeRuntime):
    """The fake runtime, with `action` run once in the loop's thread at fake time `at` (the loop waits for it)."""

    def __init__(self, at: float, action: Callable[[Midway], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.at, self.action, self.acted = at, action, False

    def poll(self) -> list[Pod]:
        if not self.acted and self.clock.now() >= self.at:
            self.acted = True
            self.action(self)
        return super().poll()


def running(runtime: FakeRuntime, prefix: str) -> list[Pod]:
    return sorted(
        (p for p in runtime.pods.values() if p.name.startswith(prefix) and p.running and p.node),
        key=lambda p: p.plan.pod_hostname,
    )


class Chain:
    """The gate's side (a pod's own token) and the controller's (the Deployment pod's token), over the run's API."""

    def __init__(self, session: ClusterSession, manifests: list[dict[str, Any]]) -> None:
        assert session.api is not None
        self.api = session.api
        (config_map,) = [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == CONFIG_CONFIGMAP]
        self.config = ControllerConfig.from_json(json.loads(config_map["data"]["config.json"]))
        self.answers: list[Answer | None] = []
        self.logs: list[str] = []
        self.bad = ""

    def client(self, pod: Pod) -> KubeApi:
        return KubeApi(self.api.url, self.api.pod_env(pod.plan)[API_TOKEN_ENV])

    def claim(self, runtime: FakeRuntime, pod: Pod, node: str, uid: str = "") -> None:
        """`pod` claims `node` failed the gate (naming itself by `uid`, its own by default); the controller polls
        once; the gate reads the answer."""
        gate, namespace, uid = self.client(pod), pod.plan.namespace, uid or pod.plan.uid
        claim = ReportedVerdict("", namespace, pod.name, uid, node, "fallback", "", "FABRIC GATE FAIL")
        event = gate.create_event(claim.to_event())["metadata"]["name"]
        (controller_pod,) = running(runtime, "fabric-gate-controller-")
        Controller(self.client(controller_pod), self.config, clock=runtime.clock.now, log=self.logs.append).tick()
        self.answers.append(wait_for_answer(gate, namespace, uid, event, wait_s=0, poll_s=0))


def rehearse_chain(
    manifests: list[dict[str, Any]],
    scripts: dict[str, list[Script]],
    at: float,
    act: Callable[[Chain, Midway], None],
    dashboard: Callable[[dict[str, Pod]], Dashboard] | None = None,
) -> tuple[Rehearsal, ClusterSession, dict[str, Any], Chain]:
    """The run loop over the fake runtime on prod's cluster (g6=3), the API server on 127.0.0.1, `act` at `at`
    (`dashboard`: the Ray heads' scripted dashboard over the runtime's pods)."""
    chains: list[Chain] = []
    runtime = Midway(at, lambda rt: act(chains[0], rt), scripts=scripts)
    if dashboard is not None:
        runtime.dashboard = dashboard(runtime.pods)
    options = Options(clock=runtime.clock, timeout_s=3600, backoff_base_s=0.0, tick_s=5.0)
    options, session = cluster_options(options, manifests, environment="prod", gpu_nodes={"g6": 3}, clock=runtime.clock)
    assert session.api is not None
    session.api.start(LoopbackNetwork())
    chains.append(Chain(session, manifests))
    try:
        prepared = prepare(manifests, options)
        result = drive(
            prepared.controllers,
            runtime,
            options,
            output_dir=Path("/nonexistent"),
            network="fake",
            notes=[],
            pod_admission=prepared.pod_admission,
        )
        return annotate(result, session), session, session.api.report(), chains[0]
    finally:
        session.api.close()


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return gate_objects()


def quota(report: dict[str, Any], resource: str = "nvidia.com/gpu") -> str:
    """The gpu-g6 flavor's nominalQuota of `resource` in ClusterQueue gpu-g6 as the API server holds it."""
    for group in report["cluster_queues"]["gpu-g6"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for r in flavor["resources"] if flavor["name"] == "gpu-g6" else []:
                if r["name"] == resource:
                    return str(r["nominalQuota"])
    raise AssertionError(report["cluster_queues"]["gpu-g6"])


def test_a_verdict_from_outside_the_admitted_gang_or_about_another_node_is_refused_and_changes_nothing(
    objects: list[dict[str, Any]],
) -> None:
    def act(chain: Chain, runtime: Midway) -> None:
        (outsider,) = running(runtime, "intruder-")
        chain.claim(runtime, outsider, str(outsider.node))
        member, other = running(runtime, "gang-")
        chain.claim(runtime, member, str(other.node))
        chain.claim(runtime, member, str(member.node), uid=other.plan.uid)

    scripts = {"gang": [Script(after_s=60)], "intruder": [Script(after_s=60)]}
    result, session, report, chain = rehearse_chain([*objects, gang(), intruder()], scripts, 10.0, act)
    outsider, other_node, other_uid = chain.answers
    assert outsider is not None, chain.logs
    assert not outsider.taken
    assert "is not a member of an admitted gang: Kueue has no Workload for it" in outsider.message
    assert other_node is not None, chain.logs
    assert not other_node.taken
    assert "a pod speaks for its own node" in other_node.message
    assert other_uid is not None, chain.logs
    assert not other_uid.taken
    assert "the Event is about another pod" in other_uid.message
    # The API server notes the verdict whose uid is not its pod's, and the answer on the same claimed uid:
    # `kubectl describe pod` would list neither.
    notes = [n for n in result.notes if "involvedObject.uid" in n]
    assert len(notes) == 2, notes
    assert all("on Pod/gang-0-" in n for n in notes), notes
    assert all(t["key"] != TAINT_KEY for n in session.nodes for t in n.taints)
    assert quota(report) == "12"
    assert report["cluster_queues"]["gpu-g6"]["annotations"] == {}
    reasons = [(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in report["events"]]
    assert reasons.count(("training", "Pod", "FabricGateVerdictRefused")) == 3, reasons
    assert not [r for r in reasons if r[2] == "FabricGateNodeTaken"]
    assert result.workload("gang").state == "Complete"
    assert result.workload("fabric-gate-controller").state == "Ready"


def test_a_gang_pods_verdict_taints_its_node_lowers_the_quota_and_the_job_is_replaced_off_it(
    objects: list[dict[str, Any]],
) -> None:
    def act(chain: Chain, runtime: Midway) -> None:
        member = running(runtime, "gang-")[0]
        chain.bad = str(member.node)
        chain.claim(runtime, member, chain.bad)

    # Both pods exit 75 (the gate's retry code, podFailurePolicy Ignore) after the verdict, then succeed.
    scripts = {"gang": [Script(code=75, after_s=20), Script(code=75, after_s=20), Script(after_s=20)]}
    result, session, report, chain = rehearse_chain([*objects, gang()], scripts, 10.0, act)
    (answer,) = chain.answers
    assert answer is not None, chain.logs
    assert answer.taken, answer.message
    job = result.workload("gang")
    assert answer.workload_uid == job.uid
    bad = chain.bad
    (node,) = [n for n in session.nodes if n.name == bad]
    assert {"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"} in node.taints
    # One node's quota (4 GPUs of a g6.12xlarge) taken from the ClusterQueue and the Kueue model at once.
    assert quota(report) == "8"
    assert bad in json.loads(report["cluster_queues"]["gpu-g6"]["annotations"]["fabric-gate.platform/taken"])["nodes"]
    group = chain.config.groups["g6"]
    assert session.admission is not None
    assert session.admission.kueue.queues.cluster_queues[group.queue].nominal(group.flavor, "nvidia.com/gpu") == 8
    events = {(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in report["events"]}
    assert events == {
        ("training", "Pod", "FabricGateFailed"),
        ("default", "Node", "FabricGateNodeTaken"),
        ("training", "Job", "FabricGateNodeTaken"),
        ("training", "Pod", "FabricGateNodeTaken"),
    }
    # The Job replaced both pods (not counted), off the tainted node; Kueue kept the admission.
    assert job.state == "Complete", (job.state, job.message)
    first, rest = job.pods[:2], job.pods[2:]
    assert bad in {p.node for p in first}
    assert len(rest) == 2, [(p.name, p.node) for p in job.pods]
    assert bad not in {p.node for p in rest}
    assert job.admission is not None
    assert job.admission["requeues"] == []
    # Who did what: the gate's token posted and listed Events in its namespace; the controller did the rest.
    by_user: dict[str, set[tuple[str, str]]] = {}
    for r in report["requests"]:
        route = r["path"].split("?")[0]
        by_user.setdefault(r["user"], set()).add((r["method"], route))
    assert by_user[GATE] == {
        ("POST", "/api/v1/namespaces/training/events"),
        ("GET", "/api/v1/namespaces/training/events"),
    }
    assert ("PATCH", f"/api/v1/nodes/{bad}") in by_user[CONTROLLER]
    assert ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6") in by_user[CONTROLLER]
    assert all(r["code"] < 400 for r in report["requests"]), [r for r in report["requests"] if r["code"] >= 400]
    # Every Event names its object's uid (kubectl describe lists it there).
    assert [n for n in result.notes if "involvedObject.uid" in n] == []


def test_a_ray_workers_verdict_is_traced_through_its_raycluster_to_the_rayjob_and_taken(
    objects: list[dict[str, Any]], lock: ImageLock
) -> None:
    # The emitted RayJob (prod, g6): the controller reads the worker pod, its owner RayCluster (KubeRay's
    # SetControllerReference), that cluster's owner RayJob, and the Workload Kueue labels with the RayJob's uid.
    job = RayFinetuneJob(model="/nonexistent/model", steps=2, batch_size=2, seq_len=32, gpu_group="g6")
    chart = RayJobChart(cdk8s.App(), "ray-finetune", environment=ENVIRONMENTS["prod"], lock=lock, job=job)
    ray_job = [o for o in chart.to_json() if o["kind"] == "RayJob"]

    def act(chain: Chain, runtime: Midway) -> None:
        pods = running(runtime, "qwen-finetune-")  # the submitter's pod among them
        worker = next(p for p in pods if p.plan.labels.get("ray.io/node-type") == "worker")
        chain.bad = str(worker.node)
        chain.claim(runtime, worker, chain.bad)

    def dashboard(pods: dict[str, Pod]) -> Dashboard:
        answer, _ = failing_first(ray_dashboard(pods), 1)  # the attempt the gate failed, then a SUCCEEDED one
        return answer

    result, _, report, chain = rehearse_chain([*objects, *ray_job], {}, 0.0, act, dashboard)
    (answer,) = chain.answers
    assert answer is not None, chain.logs
    assert answer.taken, answer.message
    assert answer.workload_uid == object_uid("RayJob", "ray", "qwen-finetune")
    outcome = result.workload("qwen-finetune")
    assert (outcome.state, outcome.status["failed"], outcome.status["succeeded"]) == ("Complete", "1", "1")
    workers = [p for p in outcome.pods if p.labels.get("ray.io/node-type") == "worker"]
    clusters = list(dict.fromkeys(p.labels["ray.io/cluster"] for p in workers))
    assert len(clusters) == 2
    assert chain.bad not in {p.node for p in workers if p.labels["ray.io/cluster"] == clusters[1]}
    asked = {(r["method"], r["path"]) for r in report["requests"] if r["user"] == CONTROLLER}
    assert ("GET", f"/apis/ray.io/v1/namespaces/ray/rayclusters/{clusters[0]}") in asked
    assert ("GET", "/apis/ray.io/v1/namespaces/ray/rayjobs/qwen-finetune") in asked
    events = {(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in report["events"]}
    assert ("ray", "RayJob", "FabricGateNodeTaken") in events
    assert quota(report) == "8"
    assert outcome.admission is not None
    assert outcome.admission["requeues"] == []

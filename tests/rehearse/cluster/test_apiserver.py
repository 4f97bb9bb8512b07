"""The cluster rehearsal's Kubernetes API (rehearse/cluster/apiserver.py) on 127.0.0.1, driven by the clients of the
fabric gate and of its controller (training/kube_api.py, fabric_controller/act.py) and authorized by the emitted
objects (k8s/charts/fabric_gate.py: RBAC and the controller's ValidatingAdmissionPolicy): the gated pods' token may
post a verdict Event in its own namespace and touch no node; the controller's taint reaches the scheduler at once;
what an identity may not do is refused with the API server's answers; what the server does not emulate is named."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import cdk8s
import pytest

from capacity_hold.decide import HOLD_ANNOTATION
from fabric_controller import act
from infra.spec import Capacity, CapacityKind, get_environment
from k8s.charts.capacity_hold import CapacityHold
from k8s.charts.fabric_gate import FabricGate, controller_config
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.nvrx_spec import NvrxFsdpJob
from rehearse.cluster.apiserver import ClusterApi
from rehearse.cluster.nodes import ClusterNode, build_nodes
from rehearse.cluster.scheduler import PodToPlace, Volumes, schedule
from rehearse.cluster.session import cluster_options
from rehearse.fake import FakeClock
from rehearse.network import LoopbackNetwork
from rehearse.options import Options
from rehearse.pods import PodPlan
from training.fabric_verdict import TAINT_KEY, TAKEN_ANNOTATION, ReportedVerdict
from training.kube_api import API_TOKEN_ENV, API_URL_ENV, MERGE_PATCH, KubeApi, KubeError

GPU_POD = {
    "nodeSelector": {"role": "gpu-worker", "platform/gpu-group": "g6"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
}
CONTROLLER = ("fabric-gate-system", "fabric-gate-controller")


def gate_objects() -> list[dict[str, Any]]:
    chart = cdk8s.Chart(cdk8s.App(), "namespaces")
    lock = check_lock(ImageLock.load())
    FabricGate(chart, "fabric-gate", environment=get_environment("prod"), lock=lock, namespaces=("ray", "training"))
    return list(chart.to_json())


@pytest.fixture
def cluster() -> Iterator[tuple[ClusterApi, list[ClusterNode]]]:
    nodes = build_nodes(get_environment("prod"), {"g6": 3})
    api = ClusterApi(nodes, gate_objects(), log=lambda _: None)
    api.start(LoopbackNetwork())
    yield api, nodes
    api.close()


def client(api: ClusterApi, namespace: str = "training", account: str = "fabric-gate", **spec: Any) -> KubeApi:
    plan = PodPlan(name="p", namespace=namespace, spec={"serviceAccountName": account, **spec}, workload="Job/j")
    env = api.pod_env(plan)
    return KubeApi(env[API_URL_ENV], env.get(API_TOKEN_ENV, "no-token"))


def gpu_nodes(nodes: list[ClusterNode]) -> list[ClusterNode]:
    return [n for n in nodes if n.group == "g6"]


def test_the_controller_taints_a_gpu_node_and_the_scheduler_keeps_new_pods_off_it(cluster: Any) -> None:
    api, nodes = cluster
    gpu = gpu_nodes(nodes)
    act.taint(client(api, *CONTROLLER), gpu[0].name, "failed")
    assert {"key": TAINT_KEY, "value": "failed", "effect": "NoSchedule"} in gpu[0].taints
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in gpu[0].taints
    placed = schedule(PodToPlace("x", "training", {}, GPU_POD), gpu, Volumes())
    assert getattr(placed, "node", None) is not None
    assert placed.node is not gpu[0]  # type: ignore[union-attr]
    only = schedule(PodToPlace("y", "training", {}, GPU_POD), gpu[:1], Volumes())
    assert "untolerated taint {platform/fabric-gate: failed}" in getattr(only, "message", ""), only


def test_the_gated_pods_token_reads_and_patches_no_node(cluster: Any) -> None:
    api, nodes = cluster
    gate, name = client(api), gpu_nodes(nodes)[0].name
    with pytest.raises(KubeError, match=r'HTTP 403.*\\"system:serviceaccount:training:fabric-gate\\" cannot get'):
        gate.get(f"/api/v1/nodes/{name}")
    taint = [{"op": "add", "path": "/spec/taints", "value": [{"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}]}]
    with pytest.raises(KubeError, match="HTTP 403"):
        gate.json_patch(f"/api/v1/nodes/{name}", taint)
    assert [t["key"] for t in gpu_nodes(nodes)[0].taints] == ["nvidia.com/gpu"]


def test_the_gate_posts_its_verdict_on_its_own_pod_and_in_no_other_namespace(cluster: Any) -> None:
    api, nodes = cluster
    claim = ReportedVerdict(
        "", "training", "nvrx-fsdp-0", "pod-uid", gpu_nodes(nodes)[0].name, "fallback", "Job/x", "m"
    )
    created = client(api).create_event(claim.to_event())
    assert created["metadata"]["namespace"] == "training"
    assert [e["involvedObject"]["kind"] for e in api.events] == ["Pod"]
    with pytest.raises(KubeError, match=r'HTTP 403.*cannot create resource \\"events\\"'):
        client(api, "training").create_event(
            {**claim.to_event(), "metadata": {"generateName": "x-", "namespace": "ray"}}
        )


def test_the_controller_posts_a_nodes_events_where_the_api_server_accepts_them(cluster: Any) -> None:
    api, nodes = cluster
    controller, node = client(api, *CONTROLLER), gpu_nodes(nodes)[0]
    uid = controller.get(f"/api/v1/nodes/{node.name}")["metadata"]["uid"]
    act.event(controller, act.NODE_EVENT_NAMESPACE, act.node_ref({"metadata": {"uid": uid}}, node.name), "R", "m")
    (event,) = api.events
    assert (event["metadata"]["namespace"], event["involvedObject"]["uid"]) == ("default", uid)
    assert api.notes == []  # kubectl describe node would list it


def test_an_event_on_a_node_in_a_workload_namespace_is_invalid_as_the_api_server_says(cluster: Any) -> None:
    api, nodes = cluster
    with pytest.raises(KubeError, match=r"HTTP 422.*does not match event.namespace"):
        act.event(client(api, *CONTROLLER), "training", act.node_ref(None, gpu_nodes(nodes)[0].name), "R", "m")


def test_another_identity_is_forbidden_and_a_pod_without_a_token_unauthorized(cluster: Any) -> None:
    api, nodes = cluster
    gpu = gpu_nodes(nodes)
    with pytest.raises(KubeError, match=r'HTTP 403.*User \\"system:serviceaccount:training:default\\" cannot get'):
        client(api, account="default").request("GET", f"/api/v1/nodes/{gpu[0].name}")
    with pytest.raises(KubeError, match="HTTP 401"):
        client(api, automountServiceAccountToken=False).request("GET", f"/api/v1/nodes/{gpu[0].name}")
    assert gpu[0].taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]


def test_the_admission_policy_denies_the_controller_anything_but_its_taint_on_a_gated_gpu_node(cluster: Any) -> None:
    api, nodes = cluster
    gpu = gpu_nodes(nodes)
    gate = client(api, *CONTROLLER)
    (system,) = [n for n in nodes if n.group != "g6"][:1]
    with pytest.raises(KubeError, match=r"HTTP 422.*only change GPU workers of a gated group"):
        act.taint(gate, system.name, "fallback")
    assert all(t["key"] != TAINT_KEY for t in system.taints)
    node = gate.request("GET", f"/api/v1/nodes/{gpu[0].name}")
    drop_gpu_taint = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/taints", "value": [{"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}]},
    ]
    with pytest.raises(KubeError, match=r"HTTP 422.*fabric-gate-controller-taint-only.*may change no taint but"):
        gate.request("PATCH", f"/api/v1/nodes/{gpu[0].name}", drop_gpu_taint, "application/json-patch+json")
    assert [t["key"] for t in gpu[0].taints] == ["nvidia.com/gpu"]
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]
    with pytest.raises(KubeError, match=r"HTTP 422.*testing value"):
        gate.request("PATCH", f"/api/v1/nodes/{gpu[0].name}", stale, "application/json-patch+json")


def _raw(api: ClusterApi, method: str, path: str, token: str, body: Any = None, ctype: str = "application/json") -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(api.url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", ctype)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    return caught.value.code, json.loads(caught.value.read())


@pytest.mark.parametrize(
    ("method", "path", "ctype", "named"),
    [
        ("GET", "/api/v1/pods", "application/json", "GET /api/v1/pods"),
        ("DELETE", "/api/v1/nodes/NODE", "application/json", "DELETE /api/v1/nodes/"),
        ("GET", "/api/v1/nodes/NODE?resourceVersion=0", "application/json", "query parameter 'resourceVersion'"),
        ("PATCH", "/api/v1/nodes/NODE", "application/merge-patch+json", "application/merge-patch+json"),
        ("GET", "/api/v1/nodes?labelSelector=role!%3Dgpu-worker", "application/json", "only k=v equality"),
        ("GET", "/api/v1/nodes?labelSelector=role+in+(a)", "application/json", "only k=v equality"),
        ("GET", "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse", "application/json", "'fieldSelector'"),
        ("GET", "/api/v1/namespaces/training/events?fieldSelector=type%3DWarning", "", "Event field 'type'"),
        ("GET", "/api/v1/namespaces/training/events?watch=1", "application/json", "query parameter 'watch'"),
        ("DELETE", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6", "", "DELETE /apis/kueue.x-k8s.io"),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6", "application/json-patch+json", "merge-patch"),
        ("GET", "/apis/kueue.x-k8s.io/v1beta2/workloads", "application/json", "GET /apis/kueue.x-k8s.io/v1beta2/"),
    ],
)
def test_what_the_server_does_not_emulate_is_named_and_stops_the_run(
    cluster: Any, method: str, path: str, ctype: str, named: str
) -> None:
    api, nodes = cluster
    gpu = gpu_nodes(nodes)
    token = client(api, *CONTROLLER).token
    code, answer = _raw(api, method, path.replace("NODE", gpu[0].name), token, [] if method == "PATCH" else None, ctype)
    assert code == 501
    assert named in answer["message"]
    problem = api.unemulated()
    assert problem is not None
    assert named in problem
    assert "does not emulate" in problem


def test_a_patch_of_anything_but_taints_is_not_emulated_for_an_identity_the_policy_does_not_bind(cluster: Any) -> None:
    api, nodes = cluster
    gpu = gpu_nodes(nodes)
    admin = api.rbac.bindings.append(
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "admin"},
            "roleRef": {"kind": "ClusterRole", "name": "all"},
            "subjects": [{"kind": "ServiceAccount", "name": "ops", "namespace": "training"}],
        }
    )
    assert admin is None
    api.rbac.roles[("ClusterRole", "", "all")] = {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}
    cordon = [{"op": "add", "path": "/spec/unschedulable", "value": True}]
    with pytest.raises(KubeError, match="HTTP 501"):
        client(api, account="ops").request(
            "PATCH", f"/api/v1/nodes/{gpu[0].name}", cordon, "application/json-patch+json"
        )
    assert "spec.unschedulable" in (api.unemulated() or "")


def hold_objects() -> list[dict[str, Any]]:
    """The Capacity Block hold controller's objects for prod with g6 on a block, and an operator's identity that may
    patch every ClusterQueue (no policy matches it)."""
    prod = get_environment("prod")
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end="2026-12-10T11:30Z")
    groups = tuple(dataclasses.replace(g, capacity=block) if g.name == "g6" else g for g in prod.gpu_node_groups)
    chart = cdk8s.Chart(cdk8s.App(), "namespaces")
    job = NvrxFsdpJob(gpu_group="g6", step_seconds=2.0)
    CapacityHold(
        chart,
        "hold",
        environment=dataclasses.replace(prod, gpu_node_groups=groups),
        lock=check_lock(ImageLock.load()),
        nvrx_job=job,
    )
    rule = {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["get", "patch"]}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "operator"}
    subject = {"kind": "ServiceAccount", "name": "operator", "namespace": "default"}
    rbac = "rbac.authorization.k8s.io/v1"
    role: dict[str, Any] = {
        "apiVersion": rbac,
        "kind": "ClusterRole",
        "metadata": {"name": "operator"},
        "rules": [rule],
    }
    binding: dict[str, Any] = {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "operator"}}
    binding |= {"roleRef": ref, "subjects": [subject]}
    return [*chart.to_json(), role, binding]


@pytest.fixture
def queued() -> Iterator[ClusterApi]:
    """The API server of a cluster rehearsal (prod, g6=3) with the environment's ClusterQueues and Kueue model, the
    fabric gate's objects, the hold controller's for g6 on a block, and an operator."""
    clock = FakeClock()
    objects = [*gate_objects(), *hold_objects()]
    _, session = cluster_options(Options(clock=clock), objects, environment="prod", gpu_nodes={"g6": 3}, clock=clock)
    assert session.api is not None
    session.api.start(LoopbackNetwork())
    yield session.api
    session.api.close()


QUEUE = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6"


def test_the_controllers_quota_move_reaches_the_kueue_model_and_a_stale_version_is_a_conflict(
    queued: ClusterApi,
) -> None:
    controller = client(queued, *CONTROLLER)
    group = controller_config(get_environment("prod"), ("ray", "training")).groups["g6"]
    before = controller.get(QUEUE)
    record = act.move_quota(controller, group, "ip-10-20-0-9.ec2.internal", sign=-1, entry={"taint": "x"}, now=1.0)
    assert list(record.nodes) == ["ip-10-20-0-9.ec2.internal"]
    assert queued.kueue is not None
    assert queued.kueue.queues.cluster_queues["gpu-g6"].nominal(group.flavor, "nvidia.com/gpu") == 8
    after = controller.get(QUEUE)
    assert int(after["metadata"]["resourceVersion"]) == int(before["metadata"]["resourceVersion"]) + 1
    stale = {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"], "annotations": {"a": "b"}}}
    conflict = r'HTTP 409.*Operation cannot be fulfilled on clusterqueues.kueue.x-k8s.io \\"gpu-g6\\": the object has'
    with pytest.raises(KubeError, match=conflict):
        controller.request("PATCH", QUEUE, stale, MERGE_PATCH)
    # act.move_quota re-reads after a conflict: a stale precondition costs one more read, not the quota move.
    back = act.move_quota(controller, group, "ip-10-20-0-9.ec2.internal", sign=+1, entry=None, now=2.0)
    assert back.nodes == {}
    assert queued.kueue.queues.cluster_queues["gpu-g6"].nominal(group.flavor, "nvidia.com/gpu") == 12


def test_a_stop_policy_patch_reaches_the_kueue_model_and_the_queue_reports_it_inactive(queued: ClusterApi) -> None:
    controller = client(queued, "default", "operator")
    kueue = queued.kueue
    assert kueue is not None
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "held", "namespace": "training", "labels": {"kueue.x-k8s.io/queue-name": "g6"}},
        "spec": {"template": {"spec": GPU_POD}},
    }
    assert [e.kind for e in kueue.submit(job, 0)] == ["Admitted"]
    controller.request("PATCH", QUEUE, {"spec": {"stopPolicy": "Hold"}}, MERGE_PATCH)
    (active,) = controller.get(QUEUE)["status"]["conditions"]
    assert (active["type"], active["status"], active["reason"]) == ("Active", "False", "Stopped")
    assert active["message"] == "Can't admit new workloads: is stopped."
    assert kueue.advance(1) == []  # Hold: the admitted workload runs on
    controller.request("PATCH", QUEUE, {"spec": {"stopPolicy": "HoldAndDrain"}}, MERGE_PATCH)
    assert [(e.kind, e.reason) for e in kueue.advance(2) if e.kind != "Pending"] == [("Evicted", "ClusterQueueStopped")]
    assert queued.actions[-1].endswith("stopPolicy HoldAndDrain")
    controller.request("PATCH", QUEUE, {"spec": {"stopPolicy": None}}, MERGE_PATCH)
    assert controller.get(QUEUE)["status"]["conditions"][0]["reason"] == "Ready"
    assert [e.kind for e in kueue.advance(3)] == ["Requeued", "Admitted"]


HOLDER = ("capacity-hold-system", "capacity-hold-controller")


def test_the_hold_controller_may_set_only_its_stop_policy_and_record_and_the_gate_controller_no_stop_policy(
    queued: ClusterApi,
) -> None:
    holder, gate = client(queued, *HOLDER), client(queued, *CONTROLLER)
    held = {"metadata": {"annotations": {HOLD_ANNOTATION: "{}"}}, "spec": {"stopPolicy": "Hold"}}
    holder.request("PATCH", QUEUE, held, MERGE_PATCH)
    assert queued.kueue is not None
    assert queued.kueue.queues.cluster_queues["gpu-g6"].stop_policy == "Hold"
    policy = r"HTTP 422.*ValidatingAdmissionPolicy 'capacity-hold-controller-stop-policy-only'.*"
    with pytest.raises(KubeError, match=policy + "HoldAndDrain would evict"):
        holder.request("PATCH", QUEUE, {"spec": {"stopPolicy": "HoldAndDrain"}}, MERGE_PATCH)
    quota = gate.get(QUEUE)["spec"]["resourceGroups"]
    quota[0]["flavors"][0]["resources"][0]["nominalQuota"] = "4"
    with pytest.raises(KubeError, match=policy + "may not change spec.resourceGroups"):
        holder.request("PATCH", QUEUE, {"spec": {"resourceGroups": quota}}, MERGE_PATCH)
    with pytest.raises(KubeError, match=policy + "may change no annotation but platform/capacity-hold"):
        holder.request("PATCH", QUEUE, {"metadata": {"annotations": {TAKEN_ANNOTATION: "{}"}}}, MERGE_PATCH)
    with pytest.raises(KubeError, match=r'HTTP 403.*clusterqueues \\"gpu-p5\\" is forbidden'):
        holder.request("PATCH", QUEUE.replace("gpu-g6", "gpu-p5"), held, MERGE_PATCH)
    gated = r"HTTP 422.*'fabric-gate-controller-quota-only'.*"
    with pytest.raises(KubeError, match=gated + "may not change spec.stopPolicy"):
        gate.request("PATCH", QUEUE, {"spec": {"stopPolicy": None}}, MERGE_PATCH)
    with pytest.raises(KubeError, match=gated + "may change no annotation but fabric-gate.platform/taken"):
        gate.request("PATCH", QUEUE, {"metadata": {"annotations": {HOLD_ANNOTATION: None}}}, MERGE_PATCH)
    assert queued.kueue.queues.cluster_queues["gpu-g6"].stop_policy == "Hold"
    assert gate.get(QUEUE)["metadata"]["annotations"] == {HOLD_ANNOTATION: "{}"}


def test_a_clusterqueue_patch_beyond_annotations_and_quota_is_not_emulated(queued: ClusterApi) -> None:
    controller = client(queued, *CONTROLLER)
    with pytest.raises(KubeError, match="HTTP 501"):
        controller.request("PATCH", QUEUE, {"spec": {"queueingStrategy": "BestEffortFIFO"}}, MERGE_PATCH)
    assert "more than metadata.annotations" in (queued.unemulated() or "")


def test_resource_names_and_namespaces_bound_what_each_identity_reads(queued: ClusterApi) -> None:
    controller, gate = client(queued, *CONTROLLER), client(queued)
    queued.cluster_queues["other"] = {**queued.cluster_queues["gpu-g6"], "metadata": {"name": "other"}}
    with pytest.raises(KubeError, match=r'HTTP 403.*clusterqueues \\"other\\" is forbidden'):
        controller.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/other")
    with pytest.raises(KubeError, match=r'HTTP 403.*cannot get resource \\"clusterqueues\\"'):
        gate.get(QUEUE)
    with pytest.raises(KubeError, match=r'HTTP 403.*cannot get resource \\"pods\\" in API group \\"\\" in the'):
        gate.get("/api/v1/namespaces/training/pods/nvrx-fsdp-0-abcde")
    with pytest.raises(KubeError, match=r'HTTP 403.*cannot list resource \\"workloads\\"'):
        gate.list_items("/apis/kueue.x-k8s.io/v1beta2/namespaces/training/workloads", label_selector="a=b")
    with pytest.raises(KubeError, match=r'HTTP 403.*cannot list resource \\"events\\".*\\"default\\"'):
        controller.list_items("/api/v1/namespaces/default/events")
    # Allowed, and absent: the API server's NotFound.
    with pytest.raises(KubeError, match=r'HTTP 404.*pods \\"nvrx-fsdp-0-abcde\\" not found'):
        controller.get("/api/v1/namespaces/training/pods/nvrx-fsdp-0-abcde")
    with pytest.raises(KubeError, match=r'HTTP 404.*jobs.batch \\"nvrx-fsdp\\" not found'):
        controller.get("/apis/batch/v1/namespaces/training/jobs/nvrx-fsdp")
    with pytest.raises(KubeError, match=r'HTTP 404.*rayclusters.ray.io \\"c\\" not found'):
        controller.get("/apis/ray.io/v1/namespaces/ray/rayclusters/c")
    assert controller.list_items("/apis/kueue.x-k8s.io/v1beta2/namespaces/training/workloads") == []
    nodes = controller.list_items("/api/v1/nodes", label_selector="platform/gpu-group=g6,role=gpu-worker")
    assert len(nodes) == 3
    assert queued.unemulated() is None

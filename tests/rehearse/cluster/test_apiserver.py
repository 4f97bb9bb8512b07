"""The cluster rehearsal's Kubernetes API (rehearse/cluster/apiserver.py) on 127.0.0.1, driven by the fabric gate's
own client (training/fabric_gate.py KubeApi, take_out) and authorized by the emitted fabric-gate chart (RBAC and the
ValidatingAdmissionPolicy, k8s/charts/fabric_gate.py): a taint the gate adds reaches the scheduler at once; what the
identity may not do is refused with the API server's answers; what the server does not emulate is named."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import cdk8s
import pytest

from infra.spec import get_environment
from k8s.charts.fabric_gate import FabricGateChart
from rehearse.cluster.apiserver import ClusterApi
from rehearse.cluster.nodes import ClusterNode, build_nodes
from rehearse.cluster.scheduler import PodToPlace, Volumes, schedule
from rehearse.network import LoopbackNetwork
from rehearse.pods import PodPlan
from training.fabric_gate import (
    API_TOKEN_ENV,
    API_URL_ENV,
    TAINT_KEY,
    GateVerdict,
    KubeApi,
    KubeError,
    Outcome,
    take_out,
)

GPU_POD = {
    "nodeSelector": {"role": "gpu-worker", "platform/gpu-group": "g6"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
}


def gate_chart() -> list[dict[str, Any]]:
    app = cdk8s.App()
    return list(FabricGateChart(app, "fabric-gate", namespaces=("ray", "training")).to_json())


@pytest.fixture
def cluster() -> Iterator[tuple[ClusterApi, list[ClusterNode]]]:
    nodes = build_nodes(get_environment("prod"), {"g6": 3})
    api = ClusterApi(nodes, gate_chart(), log=lambda _: None)
    api.start(LoopbackNetwork())
    yield api, [n for n in nodes if n.group == "g6"]
    api.close()


def client(api: ClusterApi, namespace: str = "training", account: str = "fabric-gate", **spec: Any) -> KubeApi:
    plan = PodPlan(name="p", namespace=namespace, spec={"serviceAccountName": account, **spec}, workload="Job/j")
    env = api.pod_env(plan)
    return KubeApi(env[API_URL_ENV], env.get(API_TOKEN_ENV, "no-token"))


def verdict(*suspects: str) -> GateVerdict:
    return GateVerdict(Outcome.FAIL, ("rank 1 on socket",), suspects=suspects, failing=())


def test_the_gate_taints_a_node_and_the_scheduler_keeps_new_pods_off_it(cluster: Any) -> None:
    api, gpu = cluster
    actions = take_out(verdict(gpu[0].name), client(api), namespace="training", workload="Job/nvrx-fsdp")
    assert f"tainted {gpu[0].name} {TAINT_KEY}=failed:NoSchedule" in actions, actions
    assert {"key": TAINT_KEY, "value": "failed", "effect": "NoSchedule"} in gpu[0].taints
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in gpu[0].taints
    placed = schedule(PodToPlace("x", "training", {}, GPU_POD), gpu, Volumes())
    assert getattr(placed, "node", None) is not None
    assert placed.node is not gpu[0]  # type: ignore[union-attr]
    only = schedule(PodToPlace("y", "training", {}, GPU_POD), gpu[:1], Volumes())
    assert "untolerated taint {platform/fabric-gate: failed}" in getattr(only, "message", ""), only


def test_the_gate_posts_its_events_where_the_api_server_accepts_them(cluster: Any) -> None:
    api, gpu = cluster
    actions = take_out(verdict(gpu[0].name), client(api), namespace="training", workload="Job/nvrx-fsdp")
    assert f"Event on node {gpu[0].name}" in actions, actions
    assert "Event on Job/nvrx-fsdp (without its uid: JOB_UID is not set)" in actions, actions
    by_kind = {e["involvedObject"]["kind"]: e for e in api.events}
    assert by_kind["Node"]["metadata"]["namespace"] == "default"
    assert by_kind["Job"]["metadata"]["namespace"] == "training"
    assert all(e["reason"] == "FabricGateFailed" for e in api.events)
    # The node's Event names the uid the PATCH answered with, so `kubectl describe node` lists it; the Job's has
    # none here (no JOB_UID outside a Job's pod), which the server notes.
    node_uid = client(api).request("GET", f"/api/v1/nodes/{gpu[0].name}")["metadata"]["uid"]
    assert by_kind["Node"]["involvedObject"]["uid"] == node_uid
    (note,) = api.notes
    assert note.startswith("Event training/nvrx-fsdp.fabric-gate-")
    assert "on Job/nvrx-fsdp has involvedObject.uid (none), not the object's: `kubectl describe` would not" in note


def test_a_ray_jobs_event_carries_the_uid_the_gate_reads_through_its_rbac() -> None:
    nodes = build_nodes(get_environment("prod"), {"g6": 2})
    ray_job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "qwen-finetune", "namespace": "ray"}}
    api = ClusterApi(nodes, [*gate_chart(), ray_job], log=lambda _: None)
    api.start(LoopbackNetwork())
    try:
        g6 = [n for n in nodes if n.group == "g6"]
        actions = take_out(verdict(g6[0].name), client(api, "ray"), namespace="ray", workload="RayJob/qwen-finetune")
        assert "Event on RayJob/qwen-finetune" in actions, actions
        uid = client(api, "ray").request("GET", "/apis/ray.io/v1/namespaces/ray/rayjobs/qwen-finetune")["metadata"]
        assert [e["involvedObject"].get("uid") for e in api.events if e["involvedObject"]["kind"] == "RayJob"] == [
            uid["uid"]
        ]
        assert api.notes == []
        # Another identity may neither read it nor post Events: both refusals are the API server's 403.
        other = take_out(verdict(), client(api, "ray", "default"), namespace="ray", workload="RayJob/qwen-finetune")
        assert len(other) == 1, other
        assert other[0].startswith(
            "could not post the Event on RayJob/qwen-finetune: POST /api/v1/namespaces/ray/events: HTTP 403"
        ), other
    finally:
        api.close()


def test_an_event_on_a_node_in_a_workload_namespace_is_invalid_as_the_api_server_says(cluster: Any) -> None:
    api, gpu = cluster
    gate = client(api)
    with pytest.raises(KubeError, match=r"HTTP 422.*does not match event.namespace"):
        gate.event("training", {"kind": "Node", "name": gpu[0].name, "apiVersion": "v1"}, "m")


def test_another_identity_is_forbidden_and_a_pod_without_a_token_unauthorized(cluster: Any) -> None:
    api, gpu = cluster
    with pytest.raises(KubeError, match=r'HTTP 403.*User \\"system:serviceaccount:training:default\\" cannot get'):
        client(api, account="default").request("GET", f"/api/v1/nodes/{gpu[0].name}")
    with pytest.raises(KubeError, match="HTTP 401"):
        client(api, automountServiceAccountToken=False).request("GET", f"/api/v1/nodes/{gpu[0].name}")
    assert gpu[0].taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]


def test_the_admission_policy_denies_the_gate_anything_but_its_taint(cluster: Any) -> None:
    api, gpu = cluster
    gate = client(api)
    node = gate.request("GET", f"/api/v1/nodes/{gpu[0].name}")
    drop_gpu_taint = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/spec/taints", "value": [{"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}]},
    ]
    with pytest.raises(KubeError, match=r"HTTP 422.*fabric-gate-taint-only.*may change no taint but"):
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
        ("GET", "/api/v1/nodes/NODE?resourceVersion=0", "application/json", "query parameters"),
        ("PATCH", "/api/v1/nodes/NODE", "application/merge-patch+json", "application/merge-patch+json"),
    ],
)
def test_what_the_server_does_not_emulate_is_named_and_stops_the_run(
    cluster: Any, method: str, path: str, ctype: str, named: str
) -> None:
    api, gpu = cluster
    token = client(api).token
    code, answer = _raw(api, method, path.replace("NODE", gpu[0].name), token, [] if method == "PATCH" else None, ctype)
    assert code == 501
    assert named in answer["message"]
    problem = api.unemulated()
    assert problem is not None
    assert named in problem
    assert "does not emulate" in problem


def test_a_patch_of_anything_but_taints_is_not_emulated_for_an_identity_the_policy_does_not_bind(cluster: Any) -> None:
    api, gpu = cluster
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

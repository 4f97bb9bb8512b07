"""The run loop on an environment's cluster (placement, Kueue, node loss) over the fake runtime: the real
controllers, scheduler and Kueue emulator on a fake clock of cluster time, no processes, milliseconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rehearse import Rehearsal, load_manifests
from rehearse.cluster.apiserver import ClusterApi
from rehearse.cluster.placement import NodeKill
from rehearse.cluster.session import annotate, cluster_options
from rehearse.fake import FakeRuntime, Script
from rehearse.loop import drive, prepare
from rehearse.network import LoopbackNetwork
from rehearse.options import Options
from rehearse.pods import Pod
from tests.rehearse.test_kuberay_controllers import failing_first

NS = "training"
GPU_POD = {
    "nodeSelector": {"role": "gpu-worker", "platform/gpu-group": "g6"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}
GPU_REQUESTS = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}


def gpu_job(name: str, *, queue: str | None = "g6", pods: int = 2, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "example.invalid/x:1", "command": ["true"]}
    container["resources"] = {"requests": dict(GPU_REQUESTS), "limits": dict(GPU_REQUESTS)}
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job-name": name}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container], "affinity": anti, **GPU_POD}},
            **spec,
        },
    }


def ray_dashboard(pods: dict[str, Pod]) -> Any:
    """Every launched pod of the head's cluster is an ALIVE Ray node."""

    def answer(head: Pod, path: str, now: float) -> dict[str, Any] | None:
        cluster = head.plan.labels["ray.io/cluster"]
        alive = [p for p in pods.values() if p.plan.labels.get("ray.io/cluster") == cluster and p.launched is not None]
        return {"data": {"summary": [{"raylet": {"state": "ALIVE"}} for _ in alive]}}

    return answer


def rehearse(
    manifests: list[dict[str, Any]],
    runtime: FakeRuntime | None = None,
    *,
    timeout_s: float = 4 * 3600,
    serve: Callable[[ClusterApi], None] | None = None,
    **cluster: Any,
) -> Rehearsal:
    """The run loop over the fake runtime on dev's cluster. `serve`: the run's API server is started on 127.0.0.1
    and handed to it before the run (for clients the test drives), and closed after."""
    runtime = runtime or FakeRuntime()
    options = Options(clock=runtime.clock, timeout_s=timeout_s, backoff_base_s=0.0, tick_s=5.0)
    options, session = cluster_options(options, manifests, environment="dev", clock=runtime.clock, **cluster)
    api = session.api if serve is not None else None
    if serve is not None and api is not None:
        api.start(LoopbackNetwork())
        serve(api)
    try:
        prepared = prepare(manifests, options)
        result = drive(
            prepared.controllers,
            runtime,
            options,
            output_dir=Path("/nonexistent"),
            network="fake",
            notes=prepared.notes,
            pod_admission=prepared.pod_admission,
        )
        return annotate(result, session)
    finally:
        if api is not None:
            api.close()


def test_a_gpu_job_runs_on_the_nodes_asked_for_and_each_pod_records_its_node() -> None:
    result = rehearse([gpu_job("a")], FakeRuntime({"a-": [Script(after_s=60)]}), gpu_nodes={"g6": 2})
    job = result.workload("a")
    assert job.state == "Complete", job.message
    assert job.admission is not None
    assert job.admission["admitted"] is True
    assert sorted(p.node or "" for p in job.pods) == [
        "ip-10-10-64-12.us-west-2.compute.internal",
        "ip-10-10-64-13.us-west-2.compute.internal",
    ]
    assert all(p.start_s is not None and p.end_s is not None and p.end_s - p.start_s == 60 for p in job.pods)


def test_quota_for_one_job_queues_the_second_until_the_first_finishes() -> None:
    # The g6 ClusterQueue's quota is the group's max_size (2 nodes): one two-node job at a time.
    result = rehearse(
        [gpu_job("first"), gpu_job("second")],
        FakeRuntime({"first-": [Script(after_s=600)], "second-": [Script(after_s=60)]}),
        gpu_nodes={"g6": 2},
    )
    first, second = result.workload("first"), result.workload("second")
    assert (first.state, second.state) == ("Complete", "Complete")
    assert min(p.start_s or 0 for p in second.pods) >= max(p.end_s or 0 for p in first.pods)


def test_a_job_on_a_group_without_nodes_waits_in_its_queue_and_is_never_admitted() -> None:
    # dev's g6 group deploys at 0 nodes and its quota covers those 0 nodes (issue 22 #5): the job is not
    # admitted, so no pod is created, nothing times out, and it waits with Kueue's quota message.
    result = rehearse([gpu_job("lonely")], timeout_s=3 * 3600)
    job = result.workload("lonely")
    assert job.state == "Timeout"
    assert job.admission is not None
    assert job.admission["admitted"] is False
    assert job.admission["requeues"] == []
    assert job.admission["active"] is True
    assert job.pods == []
    assert "maximum capacity (0)" in job.message, job.message


def test_with_quota_for_nodes_that_never_came_the_job_is_evicted_requeued_then_deactivated() -> None:
    # Quota above the nodes (a node group reset by cdk deploy after `trainctl scale`): Kueue admits the job, its
    # pods stay Pending on the scheduler, and waitForPodsReady (20 min) evicts it 4 times with backoff, then
    # deactivates it (issue 21). `quota_nodes` (`--quota g6=2`) sets the quota apart from the nodes.
    result = rehearse([gpu_job("lonely")], quota_nodes={"g6": 2})
    job = result.workload("lonely")
    assert job.state == "Timeout"
    assert job.admission is not None
    kinds = [r["kind"] for r in job.admission["requeues"]]
    assert kinds.count("Evicted") == 3
    assert kinds[-1] == "Deactivated"
    assert job.admission["active"] is False
    pending = {p.pending_reason for p in job.pods}
    # No g6 node exists: both system nodes fail the pod's selector.
    assert pending == {"0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."}


def test_node_loss_during_a_job_evicts_its_pod_after_the_toleration_and_the_job_replaces_it() -> None:
    # Index 0 on g6-0, index 1 on g6-1; g6-0 is lost at 100 s. The pod there is deleted 50 s (node-monitor grace,
    # Kubernetes 1.36; infra/spec/node_loss.py) + 300 s (DefaultTolerationSeconds) later with DisruptionTarget,
    # which the Ignore rule does not count; its replacement cannot use g6-0 (unreachable taint) and waits for index 1
    # to leave g6-1.
    rule = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    job = gpu_job("loss", queue=None, podFailurePolicy=rule)
    runtime = FakeRuntime({"loss-0": [Script(after_s=1000), Script(after_s=50)], "loss-1": [Script(after_s=600)]})
    result = rehearse([job], runtime, gpu_nodes={"g6": 2}, node_kills=(NodeKill(node="g6-0", seconds=100),))
    loss = result.workload("loss")
    assert loss.state == "Complete", loss.message
    assert result.cluster is not None
    nodes = {n["alias"]: n for n in result.cluster["nodes"]}
    assert nodes["g6-0"]["ready"] is False
    evicted, replacement = loss.pods[0], loss.pods[2]
    assert evicted.node == nodes["g6-0"]["name"]
    assert {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"} in evicted.conditions
    assert evicted.end_s is not None
    assert 450 <= evicted.end_s < 460
    assert replacement.node == nodes["g6-1"]["name"]
    assert replacement.start_s is not None
    assert replacement.start_s >= 600


def test_a_pod_tolerating_the_unreachable_taint_for_ever_is_never_evicted() -> None:
    job = gpu_job("stays", queue=None, pods=1)
    job["spec"]["template"]["spec"]["tolerations"].append(
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    )
    result = rehearse(
        [job],
        FakeRuntime({"stays-": [Script(after_s=5000)]}),
        gpu_nodes={"g6": 1},
        node_kills=(NodeKill(node="g6-0", seconds=10),),
        timeout_s=2000,
    )
    pod = result.workload("stays").pods[0]
    assert pod.phase == "Running"
    assert pod.conditions == []


def test_dev_ray_cluster_and_ray_job_both_run(dist: Path) -> None:
    manifests = [
        o for o in load_manifests(sorted((dist / "dev").glob("*.yaml"))) if o["kind"] in ("RayCluster", "RayJob")
    ]
    # The long-lived RayCluster's head runs for the whole rehearsal; the RayJob's pods would take 10 minutes.
    runtime = FakeRuntime({"training-head": [Script(never_ends=True)], "qwen-finetune": [Script(never_ends=True)]})
    runtime.dashboard = ray_dashboard(runtime.pods)
    result = rehearse(manifests, runtime, gpu_nodes={"g6": 2}, timeout_s=6000)
    assert result.workload("training").state == "Ready"
    ray_job = result.workload("qwen-finetune")
    assert ray_job.admission is not None
    # Today: the head stays Pending (0/4 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 node(s)
    # had volume node affinity conflict, 2 node(s) had untolerated taint ...), the RayJob is evicted at 1200,
    # 2460 and 3780 s and deactivated at 5220 s.
    assert not ray_job.admission["requeues"], ray_job.admission["requeues"]
    head = ray_job.pods[0]
    assert head.node is not None, f"RayJob head Pending: {head.pending_reason}"


def test_a_retried_ray_job_keeps_its_admission_and_is_pods_ready_again_on_its_new_cluster(dist: Path) -> None:
    # The emitted RayJob (backoffLimit 1): its first Ray job FAILS (a fabric gate's retryable verdict, say). KubeRay
    # retries on a new RayCluster; Kueue never sees it Failed, so the workload stays admitted, and its PodsReady
    # (rayClusterStatus.state == ready) drops while the old cluster is deleted and recovers on the new one.
    (job,) = [o for o in load_manifests(sorted((dist / "dev").glob("*.yaml"))) if o["kind"] == "RayJob"]
    runtime = FakeRuntime()  # Ray pods run until deleted; the submitter ends after 1 s
    runtime.dashboard, _ = failing_first(ray_dashboard(runtime.pods), 1)
    result = rehearse([job], runtime, gpu_nodes={"g6": 2}, timeout_s=6000)
    ray_job = result.workload("qwen-finetune")
    assert (ray_job.state, ray_job.status["failed"], ray_job.status["succeeded"]) == ("Complete", "1", "1")
    assert ray_job.admission is not None
    assert ray_job.admission["requeues"] == []
    assert [e["reason"] for e in ray_job.admission["pods_ready"]] == ["Started", "WaitForRecovery", "Recovered"]
    clusters = {p.labels["ray.io/cluster"] for p in ray_job.pods if "ray.io/cluster" in p.labels}
    assert len(clusters) == 2


def test_a_node_loss_after_a_path_waits_for_that_path_under_the_output_directory(tmp_path: Path) -> None:
    # NodeKill(after=...): the node is lost `seconds` after the path first exists (a committed checkpoint in the
    # process rehearsals), never while it does not.
    runtime = FakeRuntime({"wait-": [Script(after_s=600)]})
    options = Options(clock=runtime.clock, timeout_s=4 * 3600, backoff_base_s=0.0, tick_s=5.0)
    job = gpu_job("wait", queue=None, pods=1)
    kill = NodeKill(node="g6-0", seconds=30, after=Path("marker"))
    options, session = cluster_options(options, [job], environment="dev", gpu_nodes={"g6": 1}, node_kills=(kill,))
    prepared = prepare([job], options)
    result = annotate(
        drive(prepared.controllers, runtime, options, output_dir=tmp_path, network="fake", notes=[]), session
    )
    assert result.workload("wait").state == "Complete"
    assert result.cluster is not None
    assert all(n["ready"] for n in result.cluster["nodes"])

    (tmp_path / "marker").write_text("")
    runtime = FakeRuntime({"wait-": [Script(after_s=600)]})
    options = Options(clock=runtime.clock, timeout_s=4 * 3600, backoff_base_s=0.0, tick_s=5.0)
    options, session = cluster_options(options, [job], environment="dev", gpu_nodes={"g6": 1}, node_kills=(kill,))
    prepared = prepare([job], options)
    result = annotate(
        drive(prepared.controllers, runtime, options, output_dir=tmp_path, network="fake", notes=[]), session
    )
    assert result.cluster is not None
    (lost,) = [n for n in result.cluster["nodes"] if not n["ready"]]
    assert lost["alias"] == "g6-0"
    assert any(n.endswith("lost at 30.0 s") for n in result.notes), result.notes

"""RayCluster and RayJob as KubeRay v1.7.0 runs them, on the fake runtime (issue 27 findings 2, 6 and 7).

Fixtures written here from KubeRay v1.7.0 ray-operator/controllers/ray/rayjob_controller.go (InteractiveMode
-> Waiting; clusterSelector -> the RayCluster named by `ray.io/cluster`, never deleted; deletionStrategy
rules/legacy policies, shutdownAfterJobFinishes) and raycluster_controller.go (a RayCluster is never deleted
by the operator). Ray's dashboard answers are scripted: the fake runtime runs no Ray.
"""

from __future__ import annotations

from typing import Any

import pytest

from rehearse import RehearsalError
from rehearse.fake import Dashboard, FakeRuntime, Script, rehearse_fake
from rehearse.kuberay import RayClusterPods
from rehearse.pods import Pod

NS = "t"
GROUP = {
    "rayStartParams": {},
    "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}},
}


def ray_cluster(name: str, workers: int = 1) -> dict[str, Any]:
    worker = {
        "groupName": "cpu",
        "replicas": workers,
        "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.58.0"}]}},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"headGroupSpec": GROUP, "workerGroupSpecs": [worker]},
    }


def ray_job(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"entrypoint": "python -c 'print(1)'", **spec}
    if "clusterSelector" not in spec:
        body["rayClusterSpec"] = {"headGroupSpec": GROUP}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name, "namespace": NS}, "spec": body}


def submitting_job(name: str) -> dict[str, Any]:
    containers = [{"name": "submit", "image": "x", "command": ["ray", "job", "submit", "--", "python", "t.py"]}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": containers}}},
    }


def runtime_with_ray(
    ready_at: float, job_status: str = "SUCCEEDED", scripts: dict[str, list[Script]] | None = None
) -> FakeRuntime:
    """A fake runtime whose Ray dashboards answer from `ready_at`: every running pod of the head's cluster
    ALIVE, every submitted job in `job_status`."""
    runtime = FakeRuntime(scripts)

    def answer(head: Pod, path: str, now: float) -> dict[str, Any] | None:
        if now < ready_at:
            return None
        if path.startswith("nodes"):
            cluster = head.plan.labels["ray.io/cluster"]
            nodes = [p for p in runtime.pods.values() if p.running and p.plan.labels.get("ray.io/cluster") == cluster]
            return {"data": {"summary": [{"raylet": {"state": "ALIVE"}} for _ in nodes]}}
        return {"status": job_status, "message": ""}

    runtime.dashboard = answer
    return runtime


def test_a_standalone_ray_cluster_lives_until_the_job_that_uses_it_ends_then_is_reported_ready() -> None:
    # Finding 7: the cluster was torn down at its first Ready while a Job was still submitting to it.
    runtime = runtime_with_ray(0, scripts={"user-": [Script(after_s=40)]})
    result = rehearse_fake([ray_cluster("shared", workers=1), submitting_job("user")], runtime)
    cluster, user = result.workload("shared"), result.workload("user")
    assert user.state == "Complete"
    assert cluster.state == "Ready", cluster.message
    assert "kept running until the run ended" in cluster.message
    # Its head and worker ran for the whole of the Job's 40 s.
    assert all(p.wall_s >= 40 for p in cluster.pods), [p.wall_s for p in cluster.pods]
    assert result.exit_code == 0


def test_a_run_of_only_ray_clusters_ends_when_each_is_ready() -> None:
    result = rehearse_fake([ray_cluster("alone")], runtime_with_ray(6))
    w = result.workload("alone")
    assert w.state == "Ready"
    assert 6 <= w.wall_s < 12


def test_a_cluster_that_never_gets_ready_before_the_run_ends_is_not_ready_not_failed_silently() -> None:
    runtime = runtime_with_ray(1000, scripts={"user-": [Script(after_s=3)]})
    result = rehearse_fake([ray_cluster("slow"), submitting_job("user")], runtime)
    assert result.workload("slow").state == "NotReady"
    assert result.exit_code == 1


def test_a_cluster_still_coming_up_when_the_jobs_end_is_waited_for_not_reported_not_ready() -> None:
    # The Job ends at 3 s, the cluster's nodes join at 30 s (on the 2-core machine a head restarted in place by the
    # kubelet came up after the training pods finished): KubeRay would have it Ready, so the run waits for it.
    runtime = runtime_with_ray(30, scripts={"user-": [Script(after_s=3)]})
    result = rehearse_fake([ray_cluster("late"), submitting_job("user")], runtime)
    late = result.workload("late")
    assert late.state == "Ready", late.message
    assert 30 <= late.wall_s < 36
    assert result.exit_code == 0


def test_cluster_selector_runs_the_ray_job_on_the_ray_cluster_of_the_same_run_and_never_deletes_it() -> None:
    runtime = runtime_with_ray(5)
    job = ray_job("on-shared", clusterSelector={"ray.io/cluster": "shared"})
    result = rehearse_fake([ray_cluster("shared"), job], runtime)
    rj, cluster = result.workload("on-shared"), result.workload("shared")
    assert (rj.state, rj.status["jobStatus"]) == ("Complete", "SUCCEEDED"), rj.message
    # Only the submitter is the RayJob's; it was created once the selected cluster was Ready.
    assert [p.name.startswith("on-shared-") for p in rj.pods] == [True]
    assert rj.pods[0].wall_s == pytest.approx(1.0, abs=0.2)
    assert any("clusterSelector: KubeRay never deletes" in n for n in rj.notes)
    assert cluster.state == "Ready"


def test_cluster_selector_naming_no_cluster_of_the_run_is_refused_saying_kuberay_would_wait_forever() -> None:
    with pytest.raises(RehearsalError, match=r"clusterSelector .* names no RayCluster.*wait for that cluster forever"):
        rehearse_fake([ray_job("orphan", clusterSelector={"ray.io/cluster": "missing"})])


def test_interactive_mode_is_refused_explaining_it_waits_for_a_user_submission() -> None:
    with pytest.raises(RehearsalError, match="InteractiveMode waits for a user to submit"):
        rehearse_fake([ray_job("interactive", submissionMode="InteractiveMode")])


@pytest.mark.parametrize(
    ("spec", "status", "expected"),
    [
        (
            {
                "deletionStrategy": {
                    "deletionRules": [
                        {"policy": "DeleteWorkers", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 0}},
                        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 30}},
                        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
                    ]
                }
            },
            "SUCCEEDED",
            "KubeRay would DeleteWorkers 0 s after the end, then DeleteCluster 30 s after the end",
        ),
        (
            {
                "ttlSecondsAfterFinished": 10,
                "deletionStrategy": {"onSuccess": {"policy": "DeleteNone"}, "onFailure": {"policy": "DeleteCluster"}},
            },
            "FAILED",
            "deletionStrategy onFailure DeleteCluster: KubeRay would apply it 10 s after the end",
        ),
        ({"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 60}, "SUCCEEDED", "deletes the cluster 60 s"),
        ({}, "SUCCEEDED", "shutdownAfterJobFinishes is false: KubeRay keeps the cluster"),
    ],
)
def test_the_cluster_cleanup_kuberay_would_do_is_reported(spec: dict[str, Any], status: str, expected: str) -> None:
    runtime = runtime_with_ray(0, status)
    w = rehearse_fake([ray_job("cleanup", **spec)], runtime).workload("cleanup")
    assert w.status["jobStatus"] == status
    assert any(expected in n for n in w.notes), w.notes


def failing_first(nodes: Dashboard, failures: int) -> tuple[Dashboard, list[str]]:
    """A dashboard that answers `nodes` for the node check, and FAILED for the first `failures` Ray job ids
    submitted, SUCCEEDED after; the job ids asked about, in order, come back in the list."""
    asked: list[str] = []

    def answer(head: Pod, path: str, now: float) -> dict[str, Any] | None:
        if not path.startswith("api/jobs/"):
            return nodes(head, path, now)
        job_id = path.removeprefix("api/jobs/")
        if job_id not in asked:
            asked.append(job_id)
        failed = asked.index(job_id) < failures
        return {"status": "FAILED" if failed else "SUCCEEDED", "message": "exit 75" if failed else ""}

    return answer, asked


def runtime_failing_first(failures: int, *, ready_at: float = 0) -> tuple[FakeRuntime, list[str]]:
    runtime = runtime_with_ray(ready_at)
    assert runtime.dashboard is not None
    runtime.dashboard, asked = failing_first(runtime.dashboard, failures)
    return runtime, asked


def clusters_of(pods: list[Any]) -> list[str]:
    names: list[str] = []
    for pod in pods:
        cluster = pod.labels.get("ray.io/cluster") if pod.labels else None
        if cluster and cluster not in names:
            names.append(cluster)
    return names


def test_backoff_limit_retries_a_failed_ray_job_on_a_new_cluster_with_a_new_job_id() -> None:
    # KubeRay v1.7.0 checkBackoffLimitAndUpdateStatusIfNeeded: Failed with status.failed < backoffLimit+1 becomes
    # Retrying; the Retrying case deletes the cluster and the submitter, resets the status and goes to New, whose
    # initRayJobStatusIfNeed generates a new cluster name and job id (and a new StartTime).
    runtime, asked = runtime_failing_first(1)
    w = rehearse_fake([ray_job("retried", backoffLimit=1)], runtime).workload("retried")
    assert (w.state, w.status["jobStatus"]) == ("Complete", "SUCCEEDED"), w.message
    assert (w.status["failed"], w.status["succeeded"]) == ("1", "1")
    assert len(asked) == 2, asked
    assert asked[0] != asked[1]
    assert len(clusters_of(w.pods)) == 2, [p.name for p in w.pods]
    assert any("Retrying" in n and "backoffLimit 1" in n for n in w.notes), w.notes


def test_backoff_limit_bounds_the_retries_then_the_ray_job_fails_for_good() -> None:
    runtime, asked = runtime_failing_first(5)
    w = rehearse_fake([ray_job("exhausted", backoffLimit=1)], runtime).workload("exhausted")
    assert (w.state, w.status["jobStatus"]) == ("Failed", "FAILED"), w.message
    assert (w.status["failed"], w.status["succeeded"]) == ("2", "0")
    assert len(asked) == 2
    assert len(clusters_of(w.pods)) == 2


def test_without_backoff_limit_a_failed_ray_job_is_not_retried() -> None:
    runtime, asked = runtime_failing_first(1)
    w = rehearse_fake([ray_job("once")], runtime).workload("once")
    assert (w.state, w.status["failed"]) == ("Failed", "1")
    assert len(asked) == 1


def test_a_ray_job_past_its_active_deadline_is_not_retried() -> None:
    # The submitter never ends; the deadline (from StartTime) fails the RayJob with DeadlineExceeded, which KubeRay
    # never retries whatever backoffLimit says.
    runtime = runtime_with_ray(0, scripts={"late-": [Script(never_ends=True)]})
    w = rehearse_fake([ray_job("late", backoffLimit=3, activeDeadlineSeconds=30)], runtime).workload("late")
    assert w.state == "Failed"
    assert "DeadlineExceeded" in w.message
    assert w.status["failed"] == "1"
    assert len(clusters_of(w.pods)) == 1


# KubeRay v1.7.0 raycluster_controller.go reconcilePods + shouldDeletePod: a head or worker Pod whose phase is
# Failed or Succeeded is deleted, and the next reconcile creates a head (a standalone cluster: shouldSkipHeadPodRestart
# is only for a RayJob's provisioned cluster) and as many workers as `replicas` asks. The RayCluster itself never
# fails for it: its state stays what calculateStatus says (Ready once all pods were ready).
def heads(pods: list[Any]) -> list[Any]:
    return [p for p in pods if "-head-" in p.name]


def test_a_standalone_ray_cluster_whose_head_pod_fails_gets_a_new_head_pod_not_a_failed_verdict() -> None:
    runtime = runtime_with_ray(5, scripts={"alone-head-": [Script(code=1, after_s=2), Script(after_s=float("inf"))]})
    w = rehearse_fake([ray_cluster("alone")], runtime).workload("alone")
    assert w.state == "Ready", w.message
    assert len(heads(w.pods)) == 2, [p.name for p in w.pods]
    assert heads(w.pods)[0].exit_codes == {"ray-head": 1}
    assert any("deleted" in n and "created" in n and "head" in n for n in w.notes), w.notes


def test_a_failed_worker_pod_is_replaced_to_keep_the_groups_replicas() -> None:
    scripts = {"pool-cpu-worker-": [Script(code=137, after_s=3), Script(after_s=float("inf"))]}
    runtime = runtime_with_ray(5, scripts=scripts)
    w = rehearse_fake([ray_cluster("pool", workers=2)], runtime).workload("pool")
    workers = [p for p in w.pods if "-worker-" in p.name]
    assert w.state == "Ready", w.message
    # The first worker pod ended at 3 s (the script's first attempt), the other ran on: three worker pods in all.
    assert len(workers) == 3, [p.name for p in workers]
    first_end = min(workers, key=lambda p: p.end_s if p.end_s is not None else float("inf"))
    assert first_end.exit_codes["ray-worker"] == 137
    assert first_end.end_s == pytest.approx(3, abs=0.5)
    # The replacement came when that worker ended, not at the run's end.
    assert sorted(p.start_s or 0 for p in workers)[-1] == pytest.approx(3, abs=1)
    assert len(heads(w.pods)) == 1


def test_a_head_pod_that_fails_every_time_is_replaced_a_bounded_number_of_times_then_reported() -> None:
    runtime = runtime_with_ray(1000, scripts={"crash-head-": [Script(code=1, after_s=1)]})
    result = rehearse_fake([ray_cluster("crash", workers=0)], runtime)
    w = result.workload("crash")
    assert w.state == "Failed"
    assert "KubeRay would keep replacing it" in w.message, w.message
    assert 2 <= len(heads(w.pods)) <= 10
    assert result.exit_code == 1


def test_ray_start_advertises_the_gpus_kuberay_would_so_ray_places_workers_as_on_the_gpu_cluster() -> None:
    # KubeRay v1.7.0 common/pod.go setMissingRayStartParams: num-gpus from the nvidia.com/gpu limit, or the group's
    # rayStartParams. Rewriting it to 0 let Ray Train's PACK strategy put all 8 one-CPU workers of a 2-node g6 job on
    # one Ray node (a single-node gang, the fabric gate's cross-node check never ran on the second node).
    worker = {
        "groupName": "g6",
        "replicas": 2,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {"name": "ray-worker", "image": "x", "resources": {"limits": {"cpu": "40", "nvidia.com/gpu": 4}}}
                ]
            }
        },
    }
    explicit = {**worker, "groupName": "p5", "rayStartParams": {"num-gpus": "8"}}
    spec = {"headGroupSpec": {**GROUP, "rayStartParams": {"num-gpus": "0"}}, "workerGroupSpecs": [worker, explicit]}
    plans = RayClusterPods("c", NS, spec, "RayCluster/c").plans()
    commands = {p.labels["ray.io/group"]: p.spec["containers"][0]["args"][0] for p in plans}
    assert "--num-gpus=0" in commands["headgroup"]
    assert "--num-gpus=4" in commands["g6"]
    assert "--num-gpus=8" in commands["p5"]


def test_ray_pods_poll_ray_train_health_every_half_second_unless_the_manifest_says_otherwise() -> None:
    # A rehearsal difference (docs/rehearsal.md): Ray Train's controller notices a run's end at its next poll.
    worker = {
        "groupName": "g6",
        "replicas": 1,
        "template": {"spec": {"containers": [{"name": "ray-worker", "image": "x", "env": []}]}},
    }
    own = {"name": "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "value": "3"}
    set_by_chart = {
        **worker,
        "groupName": "own",
        "template": {"spec": {"containers": [{"name": "w", "image": "x", "env": [own]}]}},
    }
    spec = {"headGroupSpec": GROUP, "workerGroupSpecs": [worker, set_by_chart]}
    plans = RayClusterPods("c", NS, spec, "RayCluster/c").plans()
    intervals = {
        p.labels["ray.io/group"]: [e["value"] for e in p.spec["containers"][0]["env"] if e["name"] == own["name"]]
        for p in plans
    }
    assert intervals == {"headgroup": ["0.5"], "g6": ["0.5"], "own": ["3"]}


def test_ray_pods_and_the_submitter_carry_kuberays_labels_which_network_policies_select() -> None:
    # KubeRay v1.7.0 common/pod.go labelPod (a template label overrides all but cluster, node type and group) and
    # rayjob_controller.go getSubmitterTemplate.
    job = ray_job("labelled")
    job["spec"]["rayClusterSpec"]["headGroupSpec"] = {
        **GROUP,
        "template": {**GROUP["template"], "metadata": {"labels": {"ray.io/cluster": "mine", "team": "a"}}},
    }
    w = rehearse_fake([job], runtime_with_ray(0)).workload("labelled")
    head = next(p for p in w.pods if p.labels.get("ray.io/node-type") == "head")
    cluster = head.labels["ray.io/cluster"]
    assert cluster.startswith("labelled-")
    assert cluster != "mine"
    assert head.labels == {
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": f"{cluster}-head",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
        "team": "a",
        "ray.io/cluster": cluster,
        "ray.io/node-type": "head",
        "ray.io/group": "headgroup",
    }
    submitter = next(p for p in w.pods if "ray.io/cluster" not in p.labels)
    assert submitter.labels["ray.io/originated-from-cr-name"] == "labelled"
    assert submitter.labels["ray.io/originated-from-crd"] == "RayJob"
    assert submitter.labels["app.kubernetes.io/created-by"] == "kuberay-operator"

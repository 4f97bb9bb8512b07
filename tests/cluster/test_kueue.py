"""rehearse/cluster/kueue.py: Kueue v0.19.2 admission on the project's own queues and manager
configuration, driven by events on a deterministic clock (cluster seconds)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS
from infra.spec.kueue import KueueProps, kueue_props, manager_config
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR, gpu_group_selector, gpu_toleration
from k8s.queueing import queue_objects
from rehearse.cluster.kueue import (
    Event,
    Kueue,
    KueueAdmission,
    KueueConfig,
    KueueError,
    Queues,
    RejectedError,
    TimeScale,
    UnsupportedError,
    duration_seconds,
    job_pods_ready,
    pod_requests,
    pod_set_of,
    quantity_value,
    ray_cluster_pods_ready,
    ray_job_finished,
    workload_from_manifest,
)
from rehearse.manifests import yaml_documents

MIN = 60.0
G6_POD = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}


def rendered_config(env_name: str, *, block_admission: bool | None = None) -> KueueConfig:
    """The Configuration the Platform stack renders for the environment (infra/addons/stack.py); with
    `block_admission` that one setting changed (to test the emulator's blockAdmission)."""
    props = kueue_props(ENVIRONMENTS[env_name].add_ons.kuberay_operator)
    if block_admission is not None:
        props = dataclasses.replace(props, block_admission=block_admission)
    return KueueConfig.from_configuration(manager_config(props))


def platform_kueue(
    env_name: str, nodes: Mapping[str, int] | None = None, *, block_admission: bool | None = None
) -> Kueue:
    """The environment's Kueue with each GPU group's quota covering `nodes[group]` nodes (k8s/queueing.py
    group_nodes: desired_size where not named, as deployed), as `trainctl scale` leaves it. Without `nodes`,
    every group scaled to its max_size."""
    environment = ENVIRONMENTS[env_name]
    if nodes is None:
        nodes = {g.name: g.scaling.max_size for g in environment.gpu_node_groups}
    objects = queue_objects(environment, nodes)
    return Kueue(Queues.from_objects(objects), rendered_config(env_name, block_admission=block_admission))


def gpu_job(name: str, group: str = "g6", pods: int = 2, namespace: str = "training") -> dict[str, Any]:
    """A whole-node gang on a GPU group, as the project's charts write one."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": group}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {
                "spec": {
                    "nodeSelector": gpu_group_selector(group),
                    "tolerations": [gpu_toleration()],
                    "containers": [{"name": "main", "resources": {"requests": dict(G6_POD), "limits": dict(G6_POD)}}],
                }
            },
        },
    }


@functools.cache
def dist_objects(dist: Path, env_name: str) -> dict[str, dict[str, Any]]:
    """Every Job, RayJob and RayCluster of dist/<env>, by metadata.name (parsed once: copy before changing)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((dist / env_name).glob("*.yaml")):
        for obj in yaml_documents(path.read_text()):
            if obj and obj["kind"] in ("Job", "RayJob", "RayCluster"):
                found[obj["metadata"]["name"]] = obj
    return found


def elastic_cluster(dist: Path) -> dict[str, Any]:
    """dev's RayCluster as an autoscaling elastic job (as the project wrote it before issue 22 #3): the emulator's
    workload slices are exercised on it."""
    cluster = copy.deepcopy(dist_objects(dist, "dev")["training"])
    cluster["metadata"].setdefault("annotations", {})["kueue.x-k8s.io/elastic-job"] = "true"
    cluster["spec"]["enableInTreeAutoscaling"] = True
    sidecar = {"cpu": "500m", "memory": "512Mi"}
    cluster["spec"]["autoscalerOptions"] = {"resources": {"requests": dict(sidecar), "limits": dict(sidecar)}}
    return cluster


def kinds(events: list[Event]) -> list[tuple[float, str, str]]:
    return [(e.time / MIN, e.job.split("/")[-1], e.kind) for e in events if e.kind != "Pending"]


def key(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['namespace']}/{obj['metadata']['name']}"


# -- configuration and queue objects, as rendered


def test_config_is_the_rendered_manager_configuration() -> None:
    wait = rendered_config("dev").wait_for_pods_ready
    props = KueueProps()
    assert wait.timeout == props.pods_ready_timeout_minutes * MIN == 20 * MIN
    assert wait.recovery_timeout == props.recovery_timeout_minutes * MIN == 31 * MIN
    assert wait.block_admission is False
    assert wait.backoff_limit_count == props.requeue_limit == 3
    assert (wait.backoff_base, wait.backoff_max, wait.timestamp) == (60, 3600, "Creation")
    assert [wait.backoff(n) for n in (1, 2, 3, 7, 8)] == [60, 120, 240, 3600, 3600]
    assert rendered_config("dev").frameworks == ("batch/job", "ray.io/rayjob", "ray.io/raycluster")


def test_kueue_defaults_apply_where_the_configuration_is_silent() -> None:
    """apis/config/v1beta2/defaults.go: waitForPodsReady on, 30 min, recoveryTimeout = timeout."""
    config = KueueConfig.from_configuration({"apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration"})
    wait = config.wait_for_pods_ready
    assert (wait.timeout, wait.recovery_timeout, wait.block_admission) == (30 * MIN, 30 * MIN, False)
    assert (wait.backoff_limit_count, wait.timestamp) == (None, "Eviction")
    assert config.frameworks == ("batch/job",)


def test_queues_are_the_rendered_objects(env_name: str) -> None:
    environment = ENVIRONMENTS[env_name]
    queues = Queues.from_objects(queue_objects(environment))
    assert set(queues.cluster_queues) == {f"gpu-{g.name}" for g in environment.gpu_node_groups}
    for group in environment.gpu_node_groups:
        queue = queues.cluster_queues[f"gpu-{group.name}"]
        assert queue.strategy == "StrictFIFO"
        assert queue.namespaces == frozenset({"ray", "training"})
        assert [f.flavor for f in queue.groups[0].flavors] == ["system", f"gpu-{group.name}"]
        assert group.instance.gpu is not None
        gpus = group.instance.gpu.count * group.scaling.desired_size  # as deployed: the quota follows the nodes
        assert queue.nominal(f"gpu-{group.name}", "nvidia.com/gpu") == gpus
        for namespace in ("ray", "training"):
            assert queues.local_queues[(namespace, group.name)] == f"gpu-{group.name}"
    assert queues.flavors["system"].node_labels == dict(SYSTEM_NODE_SELECTOR)


def test_workload_features_not_emulated_are_refused() -> None:
    config = rendered_config("dev")
    job = gpu_job("urgent")
    job["spec"]["template"]["spec"]["priorityClassName"] = "high"
    with pytest.raises(UnsupportedError, match=r"PodSet main: priorityClassName"):
        workload_from_manifest(job, config)
    job = gpu_job("packed")
    job["spec"]["template"]["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": "zone"}}
    with pytest.raises(UnsupportedError, match=r"podset-required-topology \(topology-aware scheduling\)"):
        workload_from_manifest(job, config)


def test_queue_features_not_emulated_are_refused() -> None:
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"]))
    queue = next(o for o in objects if o["kind"] == "ClusterQueue")
    queue["spec"]["cohortName"] = "shared"
    with pytest.raises(UnsupportedError, match=r"ClusterQueue gpu-g6: cohortName"):
        Queues.from_objects(objects)


# -- quantities and requests as Kueue counts them


def test_bad_quantity_and_duration_say_what_is_expected() -> None:
    with pytest.raises(KueueError, match=r"memory: '8 GB' is not a Kubernetes quantity"):
        quantity_value("memory", "8 GB")  # the parser: tests/rehearse/cluster/test_quantity.py
    assert duration_seconds("1h30m") == 5400
    with pytest.raises(KueueError, match=r"'20 minutes' is not a duration"):
        duration_seconds("20 minutes")


def test_pod_requests_count_init_and_sidecar_containers_as_kubernetes_does() -> None:
    """component-helpers resource.PodRequests: containers + sidecars, maxed with each init container
    (plus the sidecars started before it), limits standing in for missing requests."""
    spec = {
        "initContainers": [
            {"name": "prepare", "resources": {"requests": {"cpu": "3"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "late", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}},
        ],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}],
    }
    # cpu: max(1 + 0.5, 3, 2 + 0.5) = 3; memory: max(2Gi + 1Gi, 1Gi + 1Gi) = 3Gi
    assert pod_requests(spec) == {"cpu": 3000, "memory": 3 * 2**30}


def test_job_pod_set_is_min_of_parallelism_and_completions() -> None:
    config = rendered_config("dev")
    job = gpu_job("a", pods=4)
    job["spec"]["completions"] = 2
    spec = workload_from_manifest(job, config)
    assert spec is not None
    ((pod_set),) = spec.pod_sets
    assert (pod_set.name, pod_set.count) == ("main", 2)
    assert pod_set.requests == {"cpu": 40000, "memory": 160 * 2**30, "nvidia.com/gpu": 4, "vpc.amazonaws.com/efa": 1}
    unlabelled = gpu_job("b")
    del unlabelled["metadata"]["labels"]
    assert workload_from_manifest(unlabelled, config) is None
    assert job_pods_ready(job, ready=1, succeeded=1) is True
    assert job_pods_ready(job, ready=1, succeeded=0) is False


def test_rayjob_submitter_and_raycluster_autoscaler_are_counted(dist: Path) -> None:
    """The submitter Job is its own PodSet (K8sJobMode, the CRD default), the autoscaler sidecar
    KubeRay injects is added to the head (raycluster/common.go BuildPodSets)."""
    config = rendered_config("dev")
    objects = dist_objects(dist, "dev")
    rayjob = workload_from_manifest(objects["qwen-finetune"], config)
    assert rayjob is not None
    assert [(p.name, p.count) for p in rayjob.pod_sets] == [("head", 1), ("g6", 2), ("submitter", 1)]
    submitter = objects["qwen-finetune"]["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["resources"]
    assert rayjob.pod_sets[2].requests == {
        "cpu": quantity_value("cpu", submitter["requests"]["cpu"]),
        "memory": quantity_value("memory", submitter["requests"]["memory"]),
    }
    head = objects["training"]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    fixed = workload_from_manifest(objects["training"], config)
    assert fixed is not None
    assert not fixed.elastic
    assert fixed.pod_sets[0].requests == {r: quantity_value(r, head[r]) for r in ("cpu", "memory")}
    assert [(p.name, p.count) for p in fixed.pod_sets] == [("head", 1), ("g6", 0)]
    elastic = elastic_cluster(dist)
    cluster = workload_from_manifest(elastic, config)
    assert cluster is not None
    assert cluster.elastic
    autoscaler = elastic["spec"]["autoscalerOptions"]["resources"]["requests"]
    assert cluster.pod_sets[0].requests == {
        r: quantity_value(r, head[r]) + quantity_value(r, autoscaler[r]) for r in ("cpu", "memory")
    }


def test_default_submitter_and_sidecar_mode_use_kuberays_defaults(dist: Path) -> None:
    config = rendered_config("dev")
    rayjob = copy.deepcopy(dist_objects(dist, "dev")["qwen-finetune"])
    del rayjob["spec"]["submitterPodTemplate"]
    spec = workload_from_manifest(rayjob, config)
    assert spec is not None
    assert spec.pod_sets[-1].requests == {"cpu": 500, "memory": 200 * 2**20}  # defaultSubmitterResources
    rayjob["spec"]["submissionMode"] = "SidecarMode"
    sidecar = workload_from_manifest(rayjob, config)
    assert sidecar is not None
    assert [p.name for p in sidecar.pod_sets] == ["head", "g6"]
    assert sidecar.pod_sets[0].requests["cpu"] == spec.pod_sets[0].requests["cpu"] + 500


def test_autoscaling_raycluster_that_is_not_elastic_is_rejected(dist: Path) -> None:
    cluster = elastic_cluster(dist)
    del cluster["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"]
    with pytest.raises(
        RejectedError,
        match=r"spec.enableInTreeAutoscaling: Invalid value: true: a kueue-managed "
        r"RayCluster can use autoscaling only as an elastic job",
    ):
        workload_from_manifest(cluster, rendered_config("dev"))
    rayjob = copy.deepcopy(dist_objects(dist, "dev")["qwen-finetune"])
    rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    with pytest.raises(RejectedError, match=r"should only use autoscaling when workload slicing is enabled"):
        workload_from_manifest(rayjob, rendered_config("dev"))


# -- flavors and quota


def test_flavors_follow_the_pod_selectors(dist: Path) -> None:
    kueue = platform_kueue("dev")
    rayjob = dist_objects(dist, "dev")["qwen-finetune"]
    (event,) = [e for e in kueue.submit(rayjob, 0) if e.kind == "Admitted"]
    assert event.admission is not None
    flavors = {ps.name: set(ps.flavors.values()) for ps in event.admission.pod_sets}
    assert flavors == {"head": {"system"}, "g6": {"gpu-g6"}, "submitter": {"system"}}
    worker = event.admission.pod_sets[1]
    assert worker.node_labels == gpu_group_selector("g6")
    assert list(worker.tolerations) == [gpu_toleration()]


def test_the_system_flavor_is_zone_blind_and_admits_both_ray_heads(dist: Path) -> None:
    """Issue 21/22 #1, Kueue's half: the RayCluster head and the RayJob head both take the `system`
    flavor, whose quota is the system nodes of every zone together; whether they fit the one system
    node of the FSx zone is for the scheduler to find out."""
    kueue = platform_kueue("dev")
    objects = dist_objects(dist, "dev")
    cluster, rayjob = objects["training"], objects["qwen-finetune"]
    kueue.submit(cluster, 0)
    (admitted,) = kueue.submit(rayjob, MIN)  # no blockAdmission: both heads at once
    assert (admitted.kind, admitted.job) == ("Admitted", key(rayjob))
    heads = [kueue.workload(key(o)).admission for o in (cluster, rayjob)]
    system_cpu = sum(a.usage().get(("system", "cpu"), 0) for a in heads if a is not None)
    expected = sum(
        ps.requests.get("cpu", 0) * ps.count
        for o in (cluster, rayjob)
        for ps in kueue.workload(key(o)).spec.pod_sets
        if ps.name in ("head", "submitter")
    )
    assert system_cpu == expected


def test_quota_exhausted_the_second_waits_then_is_admitted_when_the_first_finishes() -> None:
    kueue = platform_kueue("dev", {"g6": 2})  # the quota of the gang's 2 nodes
    first, second = gpu_job("first"), gpu_job("second")
    kueue.submit(first, 0)
    kueue.pods_ready(key(first), True, 2 * MIN)
    events = kueue.submit(second, 3 * MIN)
    (pending,) = events
    assert (pending.kind, pending.reason) == ("Pending", "Pending")
    assert pending.message == (
        "couldn't assign flavors to pod set main: flavor system doesn't match node affinity, "
        "insufficient unused quota for cpu in flavor gpu-g6, 80 more needed, "
        "insufficient unused quota for memory in flavor gpu-g6, 320Gi more needed, "
        "insufficient unused quota for nvidia.com/gpu in flavor gpu-g6, 8 more needed, "
        "insufficient unused quota for vpc.amazonaws.com/efa in flavor gpu-g6, 2 more needed"
    )
    assert kueue.admitted_counts(key(second)) is None
    events = kueue.finished(key(first), 50 * MIN, succeeded=True)
    assert kinds(events) == [(50, "first", "Finished"), (50, "second", "Admitted")]
    assert kueue.admitted_counts(key(second)) == {"main": 2}


def test_more_than_the_queue_holds_is_never_admitted() -> None:
    kueue = platform_kueue("dev", {"g6": 2})  # the quota of the gang's 2 nodes
    (pending,) = kueue.submit(gpu_job("big", pods=3), 0)
    assert "insufficient quota for nvidia.com/gpu in flavor gpu-g6, previously considered podsets requests (0) " in (
        pending.message
    )
    assert "current podset request (12) > maximum capacity (8)" in pending.message
    assert kueue.next_deadline() is None


def test_a_missing_local_queue_is_named() -> None:
    kueue = platform_kueue("dev")
    (pending,) = kueue.submit(gpu_job("lost", group="p5"), 0)
    assert pending.message == "LocalQueue p5 doesn't exist"


def test_strict_fifo_keeps_a_big_head_in_front() -> None:
    """StrictFIFO: a one-node job behind a two-node job waits even though one node's quota is free."""
    kueue = platform_kueue("dev", {"g6": 2})
    kueue.submit(gpu_job("one", pods=1), 0)
    kueue.pods_ready("Job/training/one", True, MIN)
    kueue.submit(gpu_job("two", pods=2), 2 * MIN)
    kueue.submit(gpu_job("small", pods=1), 3 * MIN)
    assert kueue.admitted_counts("Job/training/small") is None
    kueue.finished("Job/training/one", 10 * MIN, succeeded=True)
    assert kueue.admitted_counts("Job/training/two") == {"main": 2}
    assert kueue.admitted_counts("Job/training/small") is None


def test_best_effort_fifo_lets_a_smaller_job_go_first() -> None:
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"], {"g6": 2}))
    next(o for o in objects if o["kind"] == "ClusterQueue")["spec"]["queueingStrategy"] = "BestEffortFIFO"
    kueue = Kueue(Queues.from_objects(objects), rendered_config("dev"))
    kueue.submit(gpu_job("one", pods=1), 0)
    kueue.pods_ready("Job/training/one", True, MIN)
    kueue.submit(gpu_job("two", pods=2), 2 * MIN)
    kueue.submit(gpu_job("small", pods=1), 3 * MIN)
    assert kueue.admitted_counts("Job/training/small") == {"main": 1}
    assert kueue.admitted_counts("Job/training/two") is None


def test_flavor_taints_and_node_affinity_are_checked_on_the_flavors_own_keys() -> None:
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"]))
    gpu = next(o for o in objects if o["kind"] == "ResourceFlavor" and o["metadata"]["name"] == "gpu-g6")
    gpu["spec"]["nodeTaints"] = [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
    kueue = Kueue(Queues.from_objects(objects), rendered_config("dev"))
    (pending,) = kueue.submit(gpu_job("untolerated", pods=1), 0)
    assert pending.message == (
        "couldn't assign flavors to pod set main: flavor system doesn't match node affinity, "
        "untolerated taint dedicated=training:NoSchedule in flavor gpu-g6"
    )
    kueue = platform_kueue("dev")
    job = gpu_job("affinity", pods=1)
    spec = job["spec"]["template"]["spec"]
    del spec["nodeSelector"]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["system"]}]},
                ]
            }
        }
    }
    (admitted,) = [e for e in kueue.submit(job, 0) if e.kind == "Admitted"]
    assert admitted.admission is not None
    assert admitted.admission.pod_sets[0].flavors["nvidia.com/gpu"] == "gpu-g6"


# -- waitForPodsReady


def test_block_admission_holds_a_workload_in_another_cluster_queue() -> None:
    """cache.go podsReadyForAllAdmittedWorkloads loops over every ClusterQueue (why it is off: issue 22 #5)."""
    kueue = platform_kueue("prod", block_admission=True)
    p5, g6 = gpu_job("on-p5", group="p5"), gpu_job("on-g6", group="g6")
    kueue.submit(p5, 0)
    (waiting,) = kueue.submit(g6, MIN)
    assert (waiting.reason, waiting.message) == (
        "Waiting",
        "waiting for all admitted workloads to be in PodsReady condition",
    )
    assert kueue.blocked_by() == ["job-on-p5"]
    assert kueue.submit(gpu_job("third", group="g6", pods=1), 2 * MIN) == []  # the scheduler is parked
    events = kueue.pods_ready(key(p5), True, 7 * MIN)
    assert kinds(events) == [(7, "on-p5", "PodsReady"), (7, "on-g6", "Admitted")]
    assert kueue.blocked_by() == ["job-on-g6"]


def test_timeout_evicts_requeues_with_backoff_then_deactivates() -> None:
    """4 admissions x 20 min + 60 + 120 + 240 s backoff: deactivated 87 min after the first admission."""
    kueue = platform_kueue("dev")
    job = gpu_job("never-ready")
    kueue.submit(job, 0)
    events = kueue.advance(3 * 60 * MIN)
    assert kinds(events) == [
        (20, "never-ready", "Evicted"),
        (21, "never-ready", "Requeued"),
        (21, "never-ready", "Admitted"),
        (41, "never-ready", "Evicted"),
        (43, "never-ready", "Requeued"),
        (43, "never-ready", "Admitted"),
        (63, "never-ready", "Evicted"),
        (67, "never-ready", "Requeued"),
        (67, "never-ready", "Admitted"),
        (87, "never-ready", "Deactivated"),
    ]
    evicted = next(e for e in events if e.kind == "Evicted")
    assert (evicted.reason, evicted.message) == (
        "PodsReadyTimeout",
        "Exceeded the PodsReady timeout training/job-never-ready",
    )
    requeued = next(e for e in events if e.kind == "Requeued")
    assert (requeued.reason, requeued.message) == ("BackoffFinished", "The workload backoff was finished")
    deactivated = events[-1]
    assert deactivated.reason == "DeactivatedDueToRequeuingLimitExceeded"
    assert (
        deactivated.message == "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
    )
    workload = kueue.workload(key(job))
    assert (workload.active, workload.requeue_count, workload.admitted) == (False, 3, False)
    assert kueue.next_deadline() is None


def test_quota_and_the_block_are_free_during_backoff() -> None:
    """An evicted workload holds nothing while it waits out its backoff: the next one is admitted."""
    kueue = platform_kueue("dev")
    stuck, other = gpu_job("stuck"), gpu_job("other")
    kueue.submit(stuck, 0)
    kueue.submit(other, MIN)
    events = kueue.advance(20 * MIN)
    assert kinds(events) == [(20, "stuck", "Evicted"), (20, "other", "Admitted")]
    kueue.pods_ready(key(other), True, 22 * MIN)
    assert kueue.admitted_counts(key(stuck)) is None


def stopped(kueue: Kueue, policy: str, queue: str = "gpu-g6") -> Kueue:
    """The ClusterQueue's spec.stopPolicy changed, as a merge patch through the API server changes it."""
    kueue.update_cluster_queue(dataclasses.replace(kueue.queues.cluster_queues[queue], stop_policy=policy))
    return kueue


def test_a_held_queue_reserves_nothing_until_its_stop_policy_is_none_again() -> None:
    """A stopped ClusterQueue is inactive (pkg/cache/scheduler/clusterqueue.go): no head is taken from it."""
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"], {"g6": 2}))
    next(o for o in objects if o["kind"] == "ClusterQueue")["spec"]["stopPolicy"] = "Hold"
    kueue = Kueue(Queues.from_objects(objects), rendered_config("dev"))
    job = gpu_job("held")
    (pending,) = kueue.submit(job, 0)
    assert (pending.kind, pending.reason, pending.message) == (
        "Pending",
        "Inadmissible",
        "ClusterQueue gpu-g6 is inactive",
    )
    assert kueue.advance(30 * MIN) == []
    assert kueue.admitted_counts(key(job)) is None
    events = stopped(kueue, "None").advance(31 * MIN)
    assert kinds(events) == [(31, "held", "Admitted")]


def test_hold_lets_the_admitted_run_on_and_admits_nothing_after_it() -> None:
    kueue = platform_kueue("dev", {"g6": 2})
    first, second = gpu_job("first"), gpu_job("second")
    kueue.submit(first, 0)
    kueue.pods_ready(key(first), True, 2 * MIN)
    kueue.submit(second, 3 * MIN)
    assert kinds(stopped(kueue, "Hold").advance(4 * MIN)) == []
    assert kueue.admitted_counts(key(first)) == {"main": 2}
    events = kueue.finished(key(first), 50 * MIN, succeeded=True)
    assert kinds(events) == [(50, "first", "Finished")]  # the quota is free, the queue is held
    assert kueue.workload(key(second)).conditions["QuotaReserved"].message == "ClusterQueue gpu-g6 is inactive"
    assert kinds(stopped(kueue, "None").advance(60 * MIN)) == [(60, "second", "Admitted")]


def test_hold_and_drain_evicts_the_admitted_and_requeues_them_when_the_queue_restarts() -> None:
    """workload_controller.go reconcileOnClusterQueueActiveState evicts (ClusterQueueStopped); the job reconciler
    leaves Requeued False (jobframework/reconciler.go); a restarted queue sets it True (ClusterQueueRestarted)."""
    kueue = platform_kueue("dev")
    job = gpu_job("drained")
    kueue.submit(job, 0)
    kueue.pods_ready(key(job), True, 2 * MIN)
    events = stopped(kueue, "HoldAndDrain").advance(10 * MIN)
    assert kinds(events) == [(10, "drained", "Evicted")]
    assert (events[0].reason, events[0].message) == ("ClusterQueueStopped", "The ClusterQueue is stopped")
    workload = kueue.workload(key(job))
    requeued = workload.conditions["Requeued"]
    assert (requeued.status, requeued.reason) == (False, "ClusterQueueStopped")
    assert (kueue.admitted_counts(key(job)), workload.requeue_count, kueue.next_deadline()) == (None, 0, None)
    assert kinds(kueue.advance(60 * MIN)) == []
    events = stopped(kueue, "None").advance(61 * MIN)
    assert kinds(events) == [(61, "drained", "Requeued"), (61, "drained", "Admitted")]
    assert (events[0].reason, events[0].message) == (
        "ClusterQueueRestarted",
        "The ClusterQueue was restarted after being stopped",
    )


def test_a_stop_policy_kueue_does_not_know_is_refused() -> None:
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"]))
    next(o for o in objects if o["kind"] == "ClusterQueue")["spec"]["stopPolicy"] = "Drain"
    with pytest.raises(KueueError, match=r"ClusterQueue gpu-g6: stopPolicy 'Drain': None, Hold or HoldAndDrain"):
        Queues.from_objects(objects)
    objects = copy.deepcopy(queue_objects(ENVIRONMENTS["dev"]))
    next(o for o in objects if o["kind"] == "LocalQueue")["spec"]["stopPolicy"] = "Hold"
    with pytest.raises(UnsupportedError, match=r"LocalQueue g6: stopPolicy Hold"):
        Queues.from_objects(objects)


def test_recovery_timeout_evicts_a_running_workload_that_lost_a_pod() -> None:
    kueue = platform_kueue("dev", block_admission=True)
    job = gpu_job("running", pods=1)
    kueue.submit(job, 0)
    kueue.pods_ready(key(job), True, 5 * MIN)
    (lost,) = kueue.pods_ready(key(job), False, 30 * MIN)
    assert (lost.kind, lost.reason, lost.message) == (
        "PodsReady",
        "WaitForRecovery",
        "At least one pod has failed, waiting for recovery",
    )
    # While it recovers, blockAdmission holds everything else.
    (waiting,) = kueue.submit(gpu_job("next", pods=1), 31 * MIN)
    assert waiting.reason == "Waiting"
    events = kueue.advance(90 * MIN)
    # 31 min after PodsReady turned False (infra/spec/node_loss.py: a lost node's eviction, replacement, cold start).
    assert kinds(events)[0] == (61, "running", "Evicted")
    assert events[0].message == "Exceeded the PodsReady timeout training/job-running"
    assert kueue.workload(key(job)).requeue_count == 1


def test_a_pod_back_within_recovery_timeout_is_recovered() -> None:
    kueue = platform_kueue("dev")
    job = gpu_job("flaky")
    kueue.submit(job, 0)
    kueue.pods_ready(key(job), True, MIN)
    kueue.pods_ready(key(job), False, 10 * MIN)
    (back,) = kueue.pods_ready(key(job), True, 20 * MIN)
    assert (back.kind, back.reason) == ("PodsReady", "Recovered")
    assert kinds(kueue.advance(5 * 60 * MIN)) == []


def test_rayjob_finished_releases_its_quota_at_once(dist: Path) -> None:
    """RayJob.Finished is JobDeploymentStatus Complete/Failed, whatever ttlSecondsAfterFinished keeps."""
    kueue = platform_kueue("dev")
    objects = dist_objects(dist, "dev")
    rayjob, nvrx = objects["qwen-finetune"], objects["nvrx-fsdp"]
    kueue.submit(rayjob, 0)
    kueue.pods_ready(key(rayjob), ray_cluster_pods_ready("ready"), 3 * MIN)
    kueue.submit(nvrx, 4 * MIN)
    assert kueue.admitted_counts(key(nvrx)) is None
    assert ray_job_finished("Running") is False
    assert ray_job_finished("Complete") is True
    events = kueue.finished(key(rayjob), 30 * MIN, succeeded=True, message="Job finished successfully.")
    assert kinds(events) == [(30, "qwen-finetune", "Finished"), (30, "nvrx-fsdp", "Admitted")]


# -- elastic RayCluster (workload slices)


def test_elastic_raycluster_scales_in_slices(dist: Path) -> None:
    kueue = platform_kueue("dev", {"g6": 2})  # the quota of the gang's 2 nodes
    cluster = elastic_cluster(dist)
    job = key(cluster)
    kueue.submit(cluster, 0)
    assert kueue.admitted_counts(job) == {"head": 1, "g6": 0}
    kueue.pods_ready(job, ray_cluster_pods_ready("ready"), 2 * MIN)
    # The autoscaler asks for one worker: a new slice for the difference replaces the first.
    events = kueue.scale(job, {"g6": 1}, 10 * MIN)
    assert [(e.workload, e.kind, e.reason) for e in events] == [
        ("raycluster-training-slice-1", "Admitted", "Admitted"),
        ("raycluster-training", "Finished", "WorkloadSliceReplaced"),
        ("raycluster-training-slice-1", "PodsReady", "Started"),
    ]
    assert kueue.admitted_counts(job) == {"head": 1, "g6": 1}
    kueue.scale(job, {"g6": 2}, 11 * MIN)
    assert kueue.admitted_counts(job) == {"head": 1, "g6": 2}
    # A scale-down updates the admitted slice in place and frees its quota.
    assert kueue.scale(job, {"g6": 1}, 12 * MIN) == []
    assert kueue.admitted_counts(job) == {"head": 1, "g6": 1}
    assert kueue.workload(job).name == "raycluster-training-slice-2"
    # Beyond the queue's quota: the new slice (needing only the two more workers) waits, the
    # admitted one keeps running; the extra pods keep the elastic-job scheduling gate.
    (pending,) = kueue.scale(job, {"g6": 3}, 13 * MIN)
    assert pending.workload == "raycluster-training-slice-3"
    assert "insufficient unused quota for nvidia.com/gpu in flavor gpu-g6, 4 more needed" in pending.message
    assert kueue.admitted_counts(job) == {"head": 1, "g6": 1}
    kueue.delete(job, 14 * MIN)
    assert kueue.next_deadline() is None


def test_ray_pods_ready_is_the_state_kuberay_sets_once(dist: Path) -> None:
    """A scale-up slice of a RayCluster whose state is ready is PodsReady at once: its new workers
    never go through waitForPodsReady and hold no admission block."""
    kueue = platform_kueue("dev")
    cluster = elastic_cluster(dist)
    job = key(cluster)
    kueue.submit(cluster, 0)
    kueue.pods_ready(job, ray_cluster_pods_ready("ready"), MIN)
    kueue.scale(job, {"g6": 2}, 5 * MIN)
    workload = kueue.workload(job)
    assert workload.name == "raycluster-training-slice-1"
    assert workload.pods_ready
    assert kinds(kueue.advance(24 * 60 * MIN)) == []


# -- the issue-22 findings on the project's own queues and dist/ workloads (each passes since its fix landed)


def _resize_to_max(kueue: Kueue, cluster: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The RayCluster (no autoscaler) given every worker its groups allow, as docs/workloads.md resizes it (`kubectl
    patch` of workerGroupSpecs[*].replicas): the Workload no longer matches the cluster, so Kueue replaces it and
    admits head and workers anew as one gang (reconciler.go ensureOneWorkload); here, the old Workload deleted and
    the patched cluster submitted. Returns the patched cluster."""
    resized = copy.deepcopy(dict(cluster))
    for group in resized["spec"]["workerGroupSpecs"]:
        group["replicas"] = int(group["maxReplicas"])
    kueue.delete(key(cluster), now)
    kueue.submit(resized, now)
    return resized


def test_one_workload_on_an_unscaled_group_does_not_freeze_the_other_queues(dist: Path) -> None:
    """prod as deployed (every GPU group at desired_size 0), then `trainctl scale --group g6 --nodes 2`, which
    raises g6's quota with its nodes: the NVRx job on p5 can never become ready; the g6 fabric check, whose
    nodes are up, must not wait behind it."""
    kueue = platform_kueue("prod", {"g6": 2})
    objects = dist_objects(dist, "prod")
    nvrx, check = objects["nvrx-fsdp"], objects["fabric-check-g6"]
    kueue.submit(nvrx, 0)
    admitted: list[float] = []
    events = kueue.submit(check, MIN)
    for minute in range(1, 3 * 60):
        for event in [*events, *kueue.advance(minute * MIN)]:
            if event.job == key(check) and event.kind == "Admitted":
                admitted.append(event.time)
                kueue.pods_ready(key(check), True, minute * MIN)  # g6's nodes are up
        events = []
    blocked = [e for e in kueue.history if e.job == key(nvrx) and e.kind in ("Admitted", "Deactivated")]
    assert admitted
    assert admitted[0] <= MIN, (
        f"the g6 check waited {(admitted[0] - MIN) / MIN} min; the p5 job was admitted "
        f"{len(blocked) - 1} times, holding every queue {20 * (len(blocked) - 1)} min, and deactivated at "
        f"{blocked[-1].time / MIN:.0f} min ({blocked[-1].reason})"
    )
    # The p5 job waits in its own queue, saying why, and is never admitted onto nodes that do not exist.
    assert blocked == []
    pending = kueue.workload(key(nvrx))
    assert pending.active
    assert pending.pending
    assert "insufficient quota for nvidia.com/gpu in flavor gpu-p5" in pending.conditions["QuotaReserved"].message
    assert "maximum capacity (0)" in pending.conditions["QuotaReserved"].message


def test_with_quota_above_the_nodes_a_stuck_gang_holds_only_its_own_queue(dist: Path) -> None:
    """What is left when quota and nodes differ anyway (p5's quota raised, its nodes never came: a cdk
    deploy reset the node group, capacity ran out): the p5 job is admitted and times out, but only the p5
    queue waits; the g6 check is admitted at once (blockAdmission off). `trainctl status` names the
    difference."""
    kueue = platform_kueue("prod", {"p5": 2, "g6": 2})
    objects = dist_objects(dist, "prod")
    nvrx, check, p5_check = objects["nvrx-fsdp"], objects["fabric-check-g6"], objects["fabric-check-p5"]
    kueue.submit(nvrx, 0)
    assert kueue.workload(key(nvrx)).admitted
    events = kueue.submit(check, MIN)
    assert [e.kind for e in events] == ["Admitted"]
    (behind,) = kueue.submit(p5_check, 2 * MIN)
    assert behind.kind == "Pending"  # StrictFIFO in p5's own queue, behind the admitted job's quota
    history = [(e.kind, e.time / MIN) for e in kueue.advance(24 * 60 * MIN) if e.job == key(nvrx)]
    assert history[0] == ("Evicted", 20.0)
    assert history[-1][0] == "Deactivated"


def test_the_ray_clusters_workers_come_only_as_one_gang_through_the_pods_ready_guard(dist: Path) -> None:
    """Issue 22 #3. dev with g6's quota at max_size and its nodes not up. The deployed RayCluster is no elastic job,
    so no autoscaler can add workers as a slice of their own (such a slice is PodsReady at once: see
    test_ray_pods_ready_is_the_state_kuberay_sets_once). Workers come only with a resize, which Kueue admits as one
    gang with the head; with every worker Pending it is not PodsReady, and waitForPodsReady evicts it."""
    kueue = platform_kueue("dev")
    cluster = dist_objects(dist, "dev")["training"]
    kueue.submit(cluster, 0)
    kueue.pods_ready(key(cluster), ray_cluster_pods_ready("ready"), MIN)
    with pytest.raises(UnsupportedError, match=r"only an elastic job \(kueue.x-k8s.io/elastic-job\) changes size"):
        kueue.scale(key(cluster), {g["groupName"]: 1 for g in cluster["spec"]["workerGroupSpecs"]}, 5 * MIN)
    resized = _resize_to_max(kueue, cluster, 5 * MIN)
    workers = {g["groupName"]: int(g["maxReplicas"]) for g in resized["spec"]["workerGroupSpecs"]}
    assert sum(workers.values()) > 0
    assert kueue.admitted_counts(key(resized)) == {"head": 1, **workers}
    workload = kueue.workload(key(resized))
    assert not workload.pods_ready, f"{workload.name} is PodsReady with every worker Pending"
    timeout = rendered_config("dev").wait_for_pods_ready.timeout
    (evicted,) = [e for e in kueue.advance(5 * MIN + timeout) if e.job == key(resized)]
    assert (evicted.kind, evicted.time) == ("Evicted", 5 * MIN + timeout)
    assert evicted.message == f"Exceeded the PodsReady timeout {resized['metadata']['namespace']}/{workload.name}"


def test_pending_ray_workers_hold_the_groups_quota_only_until_the_pods_ready_timeout(dist: Path) -> None:
    """The NVRx job waits behind a resized RayCluster's Pending workers only until waitForPodsReady evicts the
    cluster, not for as long as the cluster lives."""
    kueue = platform_kueue("dev")
    objects = dist_objects(dist, "dev")
    cluster, nvrx = objects["training"], objects["nvrx-fsdp"]
    kueue.submit(cluster, 0)
    kueue.pods_ready(key(cluster), ray_cluster_pods_ready("ready"), MIN)
    resized = _resize_to_max(kueue, cluster, 5 * MIN)
    kueue.submit(nvrx, 10 * MIN)
    waiting = kueue.workload(key(nvrx)).conditions["QuotaReserved"].message
    assert "insufficient unused quota for nvidia.com/gpu in flavor gpu-g6" in waiting
    kueue.advance(24 * 60 * MIN)
    evicted = [e.time for e in kueue.history if e.job == key(resized) and e.kind == "Evicted"]
    admitted = [e.time for e in kueue.history if e.job == key(nvrx) and e.kind == "Admitted"]
    assert evicted, "the resized cluster was never evicted"
    assert admitted, f"nvrx-fsdp never admitted in 24 h: {kueue.workload(key(nvrx)).conditions['QuotaReserved']}"
    assert admitted[0] == evicted[0] == 5 * MIN + rendered_config("dev").wait_for_pods_ready.timeout


def test_a_finished_rayjob_frees_its_nodes_when_kueue_frees_its_quota(dist: Path) -> None:
    """Issue 22 #2: k8s/workloads.py sets ttlSecondsAfterFinished to 60 s (it was 600, and the NVRx job was
    admitted onto nodes the finished RayJob's workers still held)."""
    kueue = platform_kueue("dev")
    objects = dist_objects(dist, "dev")
    rayjob, nvrx = objects["qwen-finetune"], objects["nvrx-fsdp"]
    kueue.submit(rayjob, 0)
    kueue.pods_ready(key(rayjob), True, MIN)
    kueue.submit(nvrx, 2 * MIN)
    events = kueue.finished(key(rayjob), 30 * MIN, succeeded=True)
    (admitted,) = [e for e in events if e.job == key(nvrx) and e.kind == "Admitted"]
    # KubeRay deletes the cluster (and its GPU workers) ttlSecondsAfterFinished after the job ends.
    workers_gone = 30 * MIN + int(rayjob["spec"].get("ttlSecondsAfterFinished", 0))
    assert workers_gone - admitted.time <= 60, (
        f"nvrx-fsdp admitted at {admitted.time / MIN:.0f} min onto nodes the RayJob's workers hold "
        f"until {workers_gone / MIN:.0f} min"
    )


# -- the clock


def test_time_scale_is_one_factor() -> None:
    scale = TimeScale(60)
    assert scale.cluster(20) == 20 * MIN
    assert scale.wall(rendered_config("dev").wait_for_pods_ready.timeout) == 20
    with pytest.raises(KueueError, match=r"--time-scale 0: a factor above 0"):
        TimeScale(0)


def test_time_never_goes_back_and_unknown_jobs_are_named() -> None:
    kueue = platform_kueue("dev")
    kueue.advance(10)
    with pytest.raises(KueueError, match="time went backwards"):
        kueue.advance(5)
    with pytest.raises(KueueError, match=r"Job/training/ghost is not a workload Kueue admits"):
        kueue.pods_ready("Job/training/ghost", True, 20)


# -- the Admission seam the run loop polls (rehearse/seams.py)


@dataclasses.dataclass
class FakeClock:
    t: float = 1000.0

    def now(self) -> float:
        return self.t


@dataclasses.dataclass(frozen=True)
class Ref:
    kind: str
    name: str
    namespace: str
    obj: dict[str, Any] = dataclasses.field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Plan:
    labels: dict[str, str]


@dataclasses.dataclass
class FakePod:
    name: str
    phase: str = "Running"
    plan: Plan = dataclasses.field(default_factory=lambda: Plan({}))
    deleted_by_controller: bool = False


@dataclasses.dataclass(frozen=True)
class Waiting:
    reason: str


def seam(env_name: str, clock: FakeClock, factor: float = 60) -> KueueAdmission[Waiting]:
    return KueueAdmission(platform_kueue(env_name), clock=clock, time_scale=TimeScale(factor), pending=Waiting)


def ref(obj: dict[str, Any]) -> Ref:
    return Ref(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"], obj)


def test_seam_admits_in_turn_and_times_out_on_the_scaled_clock() -> None:
    clock = FakeClock()
    admission = seam("dev", clock)
    first, second = ref(gpu_job("first")), ref(gpu_job("second"))
    assert admission.admit(first) is True
    answer = admission.admit(second)
    assert isinstance(answer, Waiting)
    assert answer.reason.startswith("Pending: couldn't assign flavors to pod set main: ")
    third = ref(gpu_job("third", pods=1))
    answer = admission.admit(third)
    assert isinstance(answer, Waiting)
    assert answer.reason == "Pending: queued behind job-second in StrictFIFO ClusterQueue gpu-g6"
    unlabelled = gpu_job("free")
    del unlabelled["metadata"]["labels"]
    assert admission.admit(ref(unlabelled)) is True  # not Kueue's
    # One pod of two runs: not PodsReady; 20 wall seconds at 60x are Kueue's 20 minutes.
    admission.pod_ready(first, FakePod("first-0"))
    clock.t += 20
    ((evicted, reason),) = admission.evictions()
    assert evicted == first
    assert reason == "PodsReadyTimeout: Exceeded the PodsReady timeout training/job-first"
    assert admission.admit(second) is True  # the evicted one left the quota while in backoff
    answer = admission.admit(first)
    assert isinstance(answer, Waiting)
    assert answer.reason.startswith("requeued at 1260 s cluster time after PodsReadyTimeout")


def test_seam_counts_pods_ready_and_finishes_jobs_but_never_a_raycluster(dist: Path) -> None:
    clock = FakeClock()
    admission = seam("dev", clock)
    job = ref(gpu_job("job"))
    assert admission.admit(job) is True
    admission.pod_ready(job, FakePod("job-0"))
    admission.pod_ready(job, FakePod("job-1"))
    assert admission.kueue.workload(job.key).pods_ready
    admission.pod_ended(job, FakePod("job-0", phase="Succeeded"))
    assert admission.kueue.workload(job.key).pods_ready  # ready + succeeded still cover the PodSet
    admission.workload_finished(job, "Complete")
    assert admission.kueue.workload(job.key).finished
    cluster = ref(dist_objects(dist, "dev")["training"])
    assert admission.admit(cluster) is True
    head = FakePod("training-head", plan=Plan({"ray.io/node-type": "head", "ray.io/group": "headgroup"}))
    admission.pod_ready(cluster, head)
    assert admission.kueue.workload(cluster.key).pods_ready
    admission.workload_finished(cluster, "Ready")
    assert not admission.kueue.workload(cluster.key).finished  # RayCluster.Finished is always false
    placed = admission.pod_set_admission(cluster, head.plan.labels)
    assert placed is not None
    assert placed.node_labels == dict(SYSTEM_NODE_SELECTOR)
    worker_labels = {"ray.io/node-type": "worker", "ray.io/group": "g6"}
    assert pod_set_of("RayCluster", worker_labels) == "g6"
    assert pod_set_of("RayJob", {"job-name": "qwen-finetune"}) == "submitter"


def test_seam_says_when_blockadmission_keeps_a_workload_from_being_looked_at() -> None:
    admission = KueueAdmission(
        platform_kueue("prod", block_admission=True), clock=FakeClock(), time_scale=TimeScale(60), pending=Waiting
    )
    p5, g6, other = ref(gpu_job("p5", group="p5")), ref(gpu_job("g6", group="g6")), ref(gpu_job("other", pods=1))
    assert admission.admit(p5) is True
    answer = admission.admit(g6)
    assert isinstance(answer, Waiting)
    assert answer.reason == "Waiting: waiting for all admitted workloads to be in PodsReady condition"
    answer = admission.admit(other)
    assert isinstance(answer, Waiting)
    assert answer.reason == "Pending: not evaluated while blockAdmission waits for job-p5 to be PodsReady"

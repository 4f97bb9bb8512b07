"""kube-scheduler's filters (rehearse/cluster/scheduler.py) against hand-made nodes and pods: pure, milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from rehearse.cluster.scheduler import (
    BoundPod,
    Node,
    PodToPlace,
    Scheduled,
    Unschedulable,
    UnsupportedPodError,
    Volumes,
    bind,
    fit_error,
    pod_requests,
    schedule,
)

GI = 2**30
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def node(name: str, zone: str = "z-a", cpu: int = 4000, memory_gi: int = 16, **extra: Any) -> Node:
    labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone, **extra.pop("labels", {})}
    allocatable = {"cpu": cpu, "memory": memory_gi * GI, "pods": extra.pop("pods", 58), **extra.pop("extended", {})}
    return Node(name=name, labels=labels, taints=extra.pop("taints", []), allocatable=allocatable)


def container(cpu: str = "1", memory: str = "1Gi", **extra: Any) -> dict[str, Any]:
    return {"name": extra.pop("name", "main"), "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


def pod(name: str = "p", **spec: Any) -> PodToPlace:
    labels = spec.pop("labels", {"app": name})
    spec.setdefault("containers", [container()])
    return PodToPlace(name=name, namespace="ns", labels=labels, spec=spec)


def zone_claim(zone: str) -> Volumes:
    pv = {
        "kind": "PersistentVolume",
        "metadata": {"name": "pv"},
        "spec": {
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
                            ]
                        }
                    ]
                }
            }
        },
    }
    pvc = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "ns"},
        "spec": {"volumeName": "pv"},
    }
    return Volumes.from_objects([pv, pvc])


CLAIM = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]


def pending(result: Scheduled | Unschedulable) -> str:
    assert isinstance(result, Unschedulable), f"scheduled on {getattr(result, 'node', None)}"
    return result.message


def test_a_pod_too_big_for_any_node_stays_pending_with_the_fit_message() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    message = pending(schedule(pod(containers=[container(cpu="5")]), nodes, Volumes()))
    assert message == "0/3 nodes are available: 3 Insufficient cpu."


def test_both_resources_short_on_one_node_count_as_two_reasons() -> None:
    message = pending(schedule(pod(containers=[container(cpu="5", memory="20Gi")]), [node("n1")], Volumes()))
    assert message == "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory."


def test_a_claim_pinned_to_another_zone_gives_volume_node_affinity_conflict_sorted_with_the_rest() -> None:
    # The example: one node short of cpu in the volume's zone, four in another zone.
    nodes = [node("a", zone="z-a", cpu=500), *(node(f"b{i}", zone="z-b") for i in range(4))]
    message = pending(schedule(pod(volumes=CLAIM), nodes, zone_claim("z-a")))
    assert message == "0/5 nodes are available: 1 Insufficient cpu, 4 node(s) had volume node affinity conflict."


def test_a_claim_in_the_nodes_zone_schedules() -> None:
    result = schedule(pod(volumes=CLAIM), [node("b", zone="z-b"), node("a", zone="z-a")], zone_claim("z-a"))
    assert isinstance(result, Scheduled)
    assert result.node.name == "a"


def test_a_missing_claim_is_rejected_before_any_node_filter() -> None:
    message = pending(schedule(pod(volumes=CLAIM), [node("a"), node("b")], Volumes()))
    assert message == '0/2 nodes are available: persistentvolumeclaim "data" not found.'


def test_a_missing_toleration_names_the_taint() -> None:
    gpu = node("gpu", taints=[GPU_TAINT])
    message = pending(schedule(pod(), [gpu], Volumes()))
    assert message == "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: true}."
    tolerating = pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert isinstance(schedule(tolerating, [gpu], Volumes()), Scheduled)


def test_the_first_rejecting_filter_gives_the_reason() -> None:
    # Tainted and too small: TaintToleration runs before NodeResourcesFit, so only the taint is reported.
    small_gpu = node("gpu", cpu=100, taints=[GPU_TAINT])
    message = pending(schedule(pod(), [small_gpu, node("s", cpu=100)], Volumes()))
    assert (
        message
        == "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {nvidia.com/gpu: true}."
    )


def test_node_selector_and_required_node_affinity() -> None:
    nodes = [node("sys", labels={"role": "system"}), node("other", labels={"role": "gpu-worker"})]
    result = schedule(pod(nodeSelector={"role": "system"}), nodes, Volumes())
    assert isinstance(result, Scheduled)
    assert result.node.name == "sys"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["system"]}]}
                ]
            }
        }
    }
    result = schedule(pod(affinity=affinity), nodes, Volumes())
    assert isinstance(result, Scheduled)
    assert result.node.name == "other"
    message = pending(schedule(pod(nodeSelector={"role": "none"}), nodes, Volumes()))
    assert message == "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."


def test_requests_count_sidecars_and_the_largest_init_container() -> None:
    spec = {
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
            {"name": "big-init", "resources": {"requests": {"cpu": "3"}}},
        ],
        "containers": [container(cpu="1", memory="1Gi")],
    }
    # max(containers 1 + sidecar 0.2, init 3 + sidecar started before it 0.2)
    assert pod_requests(spec) == {"cpu": 3200, "memory": GI}
    spec["initContainers"][1]["resources"]["requests"]["cpu"] = "100m"
    assert pod_requests(spec) == {"cpu": 1200, "memory": GI}


def test_limits_alone_are_the_requests_and_extended_resources_count() -> None:
    spec = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "4"}}}]}
    assert pod_requests(spec) == {"cpu": 2000, "nvidia.com/gpu": 4}
    nodes = [node("sys"), node("gpu", extended={"nvidia.com/gpu": 2})]
    message = pending(schedule(pod(containers=spec["containers"]), nodes, Volumes()))
    assert message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def test_pods_already_on_a_node_take_its_room_and_too_many_pods() -> None:
    full = node("full", pods=1)
    full.pods.append(BoundPod(name="x", namespace="ns", labels={}, requests={"cpu": 3500}))
    message = pending(schedule(pod(), [full], Volumes()))
    assert message == "0/1 nodes are available: 1 Insufficient cpu, 1 Too many pods."


def test_required_anti_affinity_on_hostname_keeps_one_pod_per_node() -> None:
    term = {"labelSelector": {"matchLabels": {"job-name": "j"}}, "topologyKey": "kubernetes.io/hostname"}
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    nodes = [node("n1"), node("n2")]
    for name in ("j-0", "j-1"):
        p = pod(name, labels={"job-name": "j"}, affinity=affinity)
        result = schedule(p, nodes, Volumes())
        assert isinstance(result, Scheduled)
        bind(p, result.node)
    assert sorted(len(n.pods) for n in nodes) == [1, 1]
    message = pending(schedule(pod("j-2", labels={"job-name": "j"}, affinity=affinity), nodes, Volumes()))
    # The pod's own term rejects both nodes (the existing pods' terms are checked first and say the same).
    assert message == "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."


def test_host_ports_conflict() -> None:
    with_port = [container(ports=[{"containerPort": 8080, "hostPort": 8080}])]
    n = node("n1")
    first = pod("a", containers=with_port)
    bind(first, n)
    message = pending(schedule(pod("b", containers=with_port), [n], Volumes()))
    assert message == "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."


def test_the_least_allocated_feasible_node_is_chosen() -> None:
    busy, idle = node("busy"), node("idle")
    busy.pods.append(BoundPod(name="x", namespace="ns", labels={}, requests={"cpu": 2000}))
    result = schedule(pod(), [busy, idle], Volumes())
    assert isinstance(result, Scheduled)
    assert result.node.name == "idle"


def test_fit_error_sorts_the_histogram_as_strings() -> None:
    # "10 ..." sorts before "2 ..." as strings, as FitError.Error's sort.Strings does.
    reasons = {f"n{i}": ("Insufficient cpu",) for i in range(10)} | {"x": ("Too many pods",), "y": ("Too many pods",)}
    assert fit_error(12, reasons) == "0/12 nodes are available: 10 Insufficient cpu, 2 Too many pods."


def test_a_spread_constraint_that_must_hold_is_refused_not_ignored() -> None:
    spread = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "labelSelector": {}}]
    with pytest.raises(UnsupportedPodError, match="topologySpreadConstraints"):
        schedule(pod(topologySpreadConstraints=spread), [node("n1")], Volumes())

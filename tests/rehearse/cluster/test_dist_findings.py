"""Issue 22's placement findings on the project's own dist/<env> manifests, against the environment's cluster
(nodes from infra/spec, kube-scheduler's filters): pure, no pods run.

Each test asserts what a first real run needs. The heads' finding (issue 22 #1) was xfail(strict=True) until the
workload fix landed; it passes since, with no marker left, so a manifest that regresses fails it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS
from infra.spec.checkpoint_volumes import checkpoint_manifests
from rehearse import load_manifests
from rehearse.cluster.nodes import build_nodes
from rehearse.cluster.placement import ClusterPlacement, scheduling_spec
from rehearse.kuberay import RayClusterPods


def cluster(env_name: str, objects: list[dict[str, Any]]) -> ClusterPlacement:
    env = ENVIRONMENTS[env_name]
    nodes = build_nodes(env, {g.name: g.workload_nodes for g in env.gpu_node_groups})
    storage = env.add_ons.checkpoint_storage
    assert storage is not None
    volumes = checkpoint_manifests(
        env, storage, availability_zone=env.gpu_availability_zone, volume_handle="fs", dns_name="d", mount_name="m"
    )
    return ClusterPlacement.for_objects(nodes, [*volumes, *objects])


def head(obj: dict[str, Any]) -> tuple[str, str, dict[str, str], dict[str, Any]]:
    spec = obj["spec"]["rayClusterSpec"] if obj["kind"] == "RayJob" else obj["spec"]
    pods = RayClusterPods(obj["metadata"]["name"], obj["metadata"]["namespace"], spec, f"{obj['kind']}/x")
    plan = pods.plan("head", spec["headGroupSpec"])
    return plan.name, plan.namespace, plan.labels, scheduling_spec(plan.spec, plan.unrun_containers)


@pytest.mark.parametrize("env_name", ["dev", "prod"])
def test_the_ray_cluster_head_and_the_ray_job_head_both_get_a_node(dist: Path, env_name: str) -> None:
    objects = load_manifests(sorted((dist / env_name).glob("*.yaml")))
    placement = cluster(env_name, objects)
    by_kind = {o["kind"]: o for o in objects if o["kind"] in ("RayCluster", "RayJob")}
    first = placement.place_spec(*head(by_kind["RayCluster"]))
    assert isinstance(first, str), first
    second = placement.place_spec(*head(by_kind["RayJob"]))
    assert isinstance(second, str), f"RayJob head Pending: {getattr(second, 'reason', second)}"

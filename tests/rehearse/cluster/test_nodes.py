"""The environment's nodes (rehearse/cluster/nodes.py) from infra/spec: zones, labels, taints, allocatable and
the add-on pods each node type carries."""

from __future__ import annotations

import pytest

from infra.spec import ENVIRONMENTS, ConfigError
from infra.spec.addon_pods import ADDON_PODS
from rehearse.cluster.nodes import build_nodes, find_node

MI = 2**20


def test_dev_system_nodes_are_spread_over_the_zones_and_gpu_nodes_are_in_the_gpu_zone() -> None:
    nodes = build_nodes(ENVIRONMENTS["dev"], {"g6": 2})
    assert [(n.alias, n.zone) for n in nodes] == [
        ("system-0", "us-west-2a"),
        ("system-1", "us-west-2b"),
        ("g6-0", "us-west-2a"),
        ("g6-1", "us-west-2a"),
    ]
    system, gpu = nodes[0], nodes[2]
    assert system.name == "ip-10-10-64-11.us-west-2.compute.internal"
    assert system.labels["role"] == "system"
    assert system.taints == []
    assert system.labels["node.kubernetes.io/instance-type"] == "m7i.xlarge"
    assert system.labels["eks.amazonaws.com/nodegroup"] == "ml-dev-system"
    assert gpu.labels["platform/gpu-group"] == "g6"
    assert gpu.labels["nvidia.com/gpu.present"] == "true"
    assert gpu.taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]


def test_gpu_groups_default_to_zero_nodes_as_deployed() -> None:
    assert [n.alias for n in build_nodes(ENVIRONMENTS["prod"])] == ["system-0", "system-1", "system-2"]


def test_more_nodes_than_the_group_allows_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"--nodes g6=4.*0 to 3"):
        build_nodes(ENVIRONMENTS["dev"], {"g6": 4})
    with pytest.raises(ConfigError, match=r"--nodes='p4'"):
        build_nodes(ENVIRONMENTS["dev"], {"p4": 1})


# DaemonSet pods on every node of the dev/prod add-on set (infra/spec/addon_pods.py, chart defaults at their pins):
# aws-node 25m, kube-proxy 100m, eks-pod-identity-agent 0, cloudwatch-agent 250m/128Mi, fluent-bit 50m/25Mi,
# eks-node-monitoring-agent 10m/30Mi, fsx-csi-node 30m/104Mi; on GPU nodes also dcgm-exporter 250m/128Mi,
# the EFA device plugin 10m/20Mi and the NVIDIA device plugin (no requests).
EVERY_NODE = (25 + 100 + 0 + 250 + 50 + 10 + 30, 128 + 25 + 30 + 104)
GPU_NODE = (EVERY_NODE[0] + 250 + 10, EVERY_NODE[1] + 128 + 20)


@pytest.mark.parametrize(
    ("env", "group", "allocatable", "daemonsets"),
    [
        ("dev", "system", {"cpu": 3920, "memory": 15391 * MI, "pods": 58}, EVERY_NODE),
        (
            "dev",
            "g6",
            {"cpu": 47810, "memory": 193679 * MI, "pods": 234, "nvidia.com/gpu": 4, "vpc.amazonaws.com/efa": 1},
            GPU_NODE,
        ),
        (
            "prod",
            "p5",
            {"cpu": 191450, "memory": 2095697 * MI, "pods": 100, "nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32},
            GPU_NODE,
        ),
    ],
)
def test_allocatable_and_daemonset_overhead_per_node_type(
    env: str, group: str, allocatable: dict[str, int], daemonsets: tuple[int, int]
) -> None:
    nodes = build_nodes(ENVIRONMENTS[env], {g.name: 1 for g in ENVIRONMENTS[env].gpu_node_groups})
    node = next(n for n in nodes if n.group == group)
    assert node.allocatable == allocatable
    overhead = node.daemonset_requests()
    assert (overhead["cpu"], overhead["memory"] // MI) == daemonsets


def test_deployments_land_on_system_nodes_only_and_replicas_spread() -> None:
    nodes = build_nodes(ENVIRONMENTS["dev"], {"g6": 1})
    deployments = {p.name: p.replicas for p in ADDON_PODS if p.kind == "Deployment"}
    for node in nodes:
        placed = [p for p in node.addon_pods if p in deployments]
        if node.group != "system":
            assert placed == []
    for name, replicas in deployments.items():
        holders = [n.alias for n in nodes if name in n.addon_pods]
        assert len(holders) == min(replicas, 2), (name, holders)
        assert len(set(holders)) == len(holders), (name, holders)


def test_a_node_is_found_by_alias_or_name() -> None:
    nodes = build_nodes(ENVIRONMENTS["dev"], {"g6": 2})
    assert find_node(nodes, "g6-1").alias == "g6-1"
    assert find_node(nodes, "ip-10-10-128-11").alias == "system-1"
    with pytest.raises(ConfigError, match="--kill-node"):
        find_node(nodes, "g6-7")


def test_kill_node_parses_a_cluster_time_or_a_delay_after_a_path_under_the_output_directory() -> None:
    from pathlib import Path

    from rehearse import RehearsalError
    from rehearse.cluster.placement import NodeKill
    from rehearse.cluster.session import parse_node_kill

    assert parse_node_kill("g6-0@120") == NodeKill(node="g6-0", seconds=120.0)
    committed = "claims/training/checkpoints/nvrx-fsdp/step_000000002/COMMITTED"
    assert parse_node_kill(f"p5-0@0,after={committed}") == NodeKill(node="p5-0", seconds=0.0, after=Path(committed))
    for bad, problem in [
        ("g6-0@5,after=/etc/passwd", "relative to the output directory"),
        ("g6-0@5,after=../x", "relative to the output directory"),
        ("g6-0@5,after=", "NODE@SECONDS"),
        ("g6-0@5,before=x", "NODE@SECONDS"),
    ]:
        with pytest.raises(RehearsalError, match=problem):
            parse_node_kill(bad)

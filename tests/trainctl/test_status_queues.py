"""`trainctl status`'s GPU queue rows (issue 22 #5): each group's Kueue quota beside the nodes that can run its
pods, against a loopback Kubernetes API holding the ClusterQueues as CDK applies them and the group's nodes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.spec import get_environment
from k8s.queueing import queue_objects
from tests.trainctl.fake_kube import daemon_pod_object, node_object
from tests.trainctl.fake_queues import QueueKube
from tests.trainctl.fake_ray import HEAD_LABELS, FakeRayHead
from tests.trainctl.test_submit import HEAD, write_kubeconfig
from trainctl.cli import main
from trainctl.eks_auth import api_client_from_kubeconfig
from trainctl.node_readiness import EFA_PLUGIN, EFA_RESOURCE, GPU_RESOURCE, NODEGROUP_LABEL, NVIDIA_PLUGIN
from trainctl.queue_status import list_group_queues
from trainctl.scale import nodegroup_name

ENV = get_environment("dev")
GROUP = ENV.gpu_node_groups[0]
GPUS = GROUP.instance.gpu.count if GROUP.instance.gpu else 0
FULL = {GPU_RESOURCE: str(GPUS), EFA_RESOURCE: str(GROUP.efa_interface_count)}


def usable_nodes(count: int, *, broken: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`count` usable nodes of the group and `broken` ones whose EFA plugin never became Ready."""
    nodes, pods = [], []
    for i in range(count + broken):
        name = f"ip-10-10-0-{i}"
        nodes.append(node_object(name, labels={NODEGROUP_LABEL: nodegroup_name(ENV, GROUP)}, allocatable=FULL))
        for plugin in (NVIDIA_PLUGIN, EFA_PLUGIN):
            labels = dict(term.split("=") for term in plugin.selector.split(","))
            unschedulable = "0/1 nodes are available" if i >= count and plugin is EFA_PLUGIN else None
            pod = daemon_pod_object(f"{plugin.name}-{name}", node=name, labels=labels, unschedulable=unschedulable)
            pods.append(pod)
    return nodes, pods


@pytest.fixture
def queues() -> Iterator[Any]:
    made: list[QueueKube] = []

    def make(quota_nodes: int, nodes: int, broken: int = 0) -> QueueKube:
        cluster_queues = [o for o in queue_objects(ENV, {GROUP.name: quota_nodes}) if o["kind"] == "ClusterQueue"]
        kube = QueueKube(lambda poll: usable_nodes(nodes, broken=broken), cluster_queues)
        kube.start()
        made.append(kube)
        return kube

    yield make
    for kube in made:
        kube.stop()
        assert kube.handler_errors == []


def rows(kube: QueueKube, tmp_path: Path) -> list[Any]:
    api = api_client_from_kubeconfig(write_kubeconfig(tmp_path / "kubeconfig", kube.url), None)
    try:
        found = list_group_queues(api, timeout=5.0)
    finally:
        api.close()
    assert found is not None
    return found


def test_quota_and_nodes_that_agree_need_no_warning(queues: Any, tmp_path: Path) -> None:
    (row,) = rows(queues(quota_nodes=2, nodes=2), tmp_path)
    assert (row.environment, row.group, row.queue) == ("dev", "g6", "gpu-g6")
    assert (row.quota_nodes, row.usable_nodes, row.registered_nodes, row.difference) == (2, 2, 2, None)


def test_quota_above_the_usable_nodes_names_the_cost_and_the_fix(queues: Any, tmp_path: Path) -> None:
    """A cdk deploy reset the node group, or a node's EFA plugin never came up: the quota covers more."""
    (row,) = rows(queues(quota_nodes=2, nodes=1, broken=1), tmp_path)
    assert (row.quota_nodes, row.usable_nodes, row.registered_nodes) == (2, 1, 2)
    assert row.difference == (
        "gpu-g6 covers 2 node(s) but 1 are usable: a gang admitted onto the missing ones stays Pending until "
        "waitForPodsReady evicts it (20 min, four times, then deactivated); "
        "`trainctl scale --env dev --group g6 --nodes 2` sets the quota to the usable nodes"
    )


def test_quota_below_the_nodes_as_after_a_platform_deploy(queues: Any, tmp_path: Path) -> None:
    (row,) = rows(queues(quota_nodes=0, nodes=2), tmp_path)
    assert row.difference is not None
    assert row.difference.startswith("gpu-g6 covers 0 node(s) of 2 usable: Kueue admits nothing onto the other 2")
    assert row.difference.endswith("`trainctl scale --env dev --group g6 --nodes 2` raises it")


def test_status_shows_the_queues_and_warns_with_the_fix(
    queues: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = queues(quota_nodes=2, nodes=0)
    kube.add_pod(HEAD, labels=HEAD_LABELS)
    FakeRayHead(kube)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    code = main(["status", "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "GPU queues (Kueue quota in whole nodes, beside the nodes that can run its pods):" in out
    assert out.splitlines()[-1].split() == ["g6", "gpu-g6", "2", "0", "0", "NO", "(see", "the", "warning)"]
    assert "warning: gpu-g6 covers 2 node(s) but 0 are usable" in err
    assert "`trainctl scale --env dev --group g6 --nodes 0` sets the quota to the usable nodes" in err
    code = main(["status", "--kubeconfig", str(kubeconfig), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["gpu_queues"] == [
        {
            "environment": "dev",
            "group": "g6",
            "cluster_queue": "gpu-g6",
            "quota_nodes": 2,
            "usable_nodes": 0,
            "registered_nodes": 0,
            "difference": document["gpu_queues"][0]["difference"],
            "taken_out": [],
            "stop_policy": {"policy": "None", "held_for_block_ending": None},
            "capacity_block": None,
        }
    ]
    assert document["gpu_queues"][0]["difference"].startswith("gpu-g6 covers 2 node(s) but 0 are usable")


def test_the_quota_the_gate_controller_took_out_is_shown_with_the_release_command(queues: Any, tmp_path: Path) -> None:
    """The controller (fabric_controller/) lowered the quota by one node and recorded the node on the queue."""
    from trainctl.queue_status import render
    from training.fabric_verdict import TAKEN_ANNOTATION

    kube = queues(quota_nodes=2, nodes=2)
    (queue,) = kube.queues.values()
    record = {"nodes": {"ip-10-10-0-1": {"at": 1.0, "taint": "fallback"}}, "recent": [1.0]}
    queue["metadata"].setdefault("annotations", {})[TAKEN_ANNOTATION] = json.dumps(record)
    (row,) = rows(kube, tmp_path)
    assert row.taken_out == ("ip-10-10-0-1",)
    assert row.to_json()["taken_out"] == [
        {"node": "ip-10-10-0-1", "release": "kubectl taint node ip-10-10-0-1 platform/fabric-gate:NoSchedule-"}
    ]
    text = "\n".join(render([row]))
    assert "took out with a node" in text
    assert "kubectl taint node ip-10-10-0-1 platform/fabric-gate:NoSchedule-" in text


def test_a_held_queue_is_shown_with_who_held_it_and_why(queues: Any, tmp_path: Path) -> None:
    """The Capacity Block hold controller (capacity_hold/) held the queue: its record says for which block."""
    from capacity_hold.decide import HOLD_ANNOTATION, HoldRecord
    from trainctl.queue_status import render

    kube = queues(quota_nodes=2, nodes=2)
    (queue,) = kube.queues.values()
    queue["spec"]["stopPolicy"] = "Hold"
    record = HoldRecord("2026-12-10T11:30:00+00:00", "2026-12-10T10:10:00+00:00", "startup 1200 s")
    queue["metadata"].setdefault("annotations", {})[HOLD_ANNOTATION] = record.dump()
    (row,) = rows(kube, tmp_path)
    assert row.to_json()["stop_policy"] == {"policy": "Hold", "held_for_block_ending": "2026-12-10T11:30:00+00:00"}
    text = "\n".join(render([row]))
    assert "admit no new workload" in text
    # dev's g6 is not on a block in this checkout: the hold outlived the block.
    assert "held for the Capacity Block that ended 2026-12-10T11:30:00+00:00, but the group is no longer" in text
    assert "delete namespace capacity-hold-system" in text
    blocked = dataclasses.replace(row, on_block=True)
    assert "the Capacity Block ends 2026-12-10T11:30:00+00:00 (held from" in "\n".join(render([blocked]))
    queue["metadata"]["annotations"].pop(HOLD_ANNOTATION)
    (row,) = rows(kube, tmp_path)
    text = "\n".join(render([row]))
    assert "set by someone else" in text
    assert 'kubectl patch clusterqueue gpu-g6 --type merge -p \'{"spec":{"stopPolicy":"None"}}\'' in text


def test_a_block_queue_says_until_when_it_admits_from_the_deployed_hold_config(queues: Any, tmp_path: Path) -> None:
    """The hold controller's deployed config (its ConfigMap) gives each block group's end and the moment Kueue stops
    admitting there; status shows it before the hold, for the queue that is not held yet."""
    from capacity_hold.config import BlockGroup, HoldConfig
    from trainctl.queue_status import HOLD_CONFIG_PATH, render

    kube = queues(quota_nodes=2, nodes=2)
    config = HoldConfig({"g6": BlockGroup("g6", "gpu-g6", "2026-12-10T11:30:00+00:00", 2400.0, 2400.0, "x")})
    kube.config_maps[HOLD_CONFIG_PATH] = {"data": {"config.json": json.dumps(config.to_json())}}
    (row,) = rows(kube, tmp_path)
    assert row.to_json()["capacity_block"] == {
        "ends": "2026-12-10T11:30:00+00:00",
        "admits_until": "2026-12-10T10:10:00+00:00",
    }
    text = "\n".join(render([row]))
    assert "Capacity Block queues" in text
    assert "2026-12-10T10:10:00+00:00" in text
    kube.config_maps.clear()
    (row,) = rows(kube, tmp_path)
    assert row.to_json()["capacity_block"] is None
    assert "Capacity Block queues" not in "\n".join(render([row]))

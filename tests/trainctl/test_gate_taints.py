"""Nodes the fabric gate took out, as `trainctl status` and `trainctl scale` show them, with the release command."""

from __future__ import annotations

from kubernetes import client

from tests.trainctl.fake_kube import ClusterKube, node_object
from trainctl import gate_taints
from trainctl.node_readiness import Expectation, NodeView, node_problems
from trainctl.status import StatusReport
from training.fabric_gate import TAINT_KEY

GATE = {"key": TAINT_KEY, "value": "below-floor", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def test_every_gate_tainted_node_is_listed_from_the_api() -> None:
    nodes = [node_object("ip-10-1-0-2", taints=[GPU]), node_object("ip-10-1-0-3", taints=[GPU, GATE])]
    kube = ClusterKube(lambda poll: (nodes, []))
    kube.start()
    try:
        configuration = client.Configuration()
        configuration.host = kube.url
        with client.ApiClient(configuration) as api:
            found = gate_taints.list_gate_tainted(api, timeout=5)
    finally:
        kube.stop()
    assert found == [gate_taints.GateTaint("ip-10-1-0-3", "below-floor")]
    assert found[0].release == f"kubectl taint node ip-10-1-0-3 {TAINT_KEY}:NoSchedule-"


def test_status_shows_them_with_the_release_command() -> None:
    report = StatusReport("ray", "training", "dev")
    report.gate_tainted = [gate_taints.GateTaint("ip-10-1-0-3", "fallback")]
    out, _ = report.render()
    assert f"Nodes taken out by the fabric gate ({TAINT_KEY}; why: kubectl describe node NODE, its Events):" in out
    row = out.splitlines()[-1].split()
    assert row[:2] == ["ip-10-1-0-3", "fallback"]
    assert " ".join(row[2:]) == f"kubectl taint node ip-10-1-0-3 {TAINT_KEY}:NoSchedule-"
    assert report.to_json()["gate_tainted_nodes"] == [
        {
            "node": "ip-10-1-0-3",
            "reason": "fallback",
            "release": f"kubectl taint node ip-10-1-0-3 {TAINT_KEY}:NoSchedule-",
        }
    ]
    assert "fabric gate" not in StatusReport("ray", "training", "dev").render()[0]


def test_scale_counts_a_gate_tainted_node_as_unusable_and_says_how_to_release_it() -> None:
    taints = (f"{GPU['key']}=true:NoSchedule", f"{TAINT_KEY}=below-floor:NoSchedule")
    node = NodeView("ip-10-1-0-3", True, "", {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}, taints)
    (problem,) = node_problems(node, Expectation(nodes=1, gpus=8, efa=32, plugins=()), {})
    release = f"kubectl taint node ip-10-1-0-3 {TAINT_KEY}:NoSchedule-"
    assert problem == f"taken out by the fabric gate (below-floor); after repair: {release}"
    assert gate_taints.problems("n", (f"{GPU['key']}=true:NoSchedule",)) == []

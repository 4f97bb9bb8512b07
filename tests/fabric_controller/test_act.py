"""The controller's writes against loopback API servers: a taint that keeps every other taint and survives a
concurrent writer, and a quota move that re-reads a ClusterQueue changed under it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fabric_controller import act
from fabric_controller.config import GroupConfig
from tests.fabric_controller.objects_api import ObjectsApi, serving
from tests.fabric_gate.fake_apiserver import FakeApiServer
from training.fabric_verdict import TAINT_KEY
from training.kube_api import KubeApi, KubeError

GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
G6 = GroupConfig("g6", "gpu-g6", "gpu-g6", {"nvidia.com/gpu": "4"})
CQ = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6"


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.add_node("node-a")
    server.add_node("node-b", taints=[GPU])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_taint_keeps_the_other_taints_and_rereads_after_a_concurrent_change(apiserver: FakeApiServer) -> None:
    apiserver.conflicts = 1  # a concurrent writer changes the node once: the patch's test fails, it re-reads
    act.taint(KubeApi(apiserver.url, "t"), "node-b", "below-floor")
    assert apiserver.nodes["node-b"]["spec"]["taints"] == [
        GPU,
        {"key": TAINT_KEY, "value": "below-floor", "effect": "NoSchedule"},
    ]
    assert "taints" not in apiserver.nodes["node-a"]["spec"]
    patches = [r for r in apiserver.requests if r.method == "PATCH"]
    assert len(patches) == 2
    assert {r.content_type for r in patches} == {"application/json-patch+json"}


def test_a_node_that_is_gone_is_an_error_not_a_guess(apiserver: FakeApiServer) -> None:
    with pytest.raises(KubeError, match="HTTP 404"):
        act.taint(KubeApi(apiserver.url, "t"), "node-gone", "fallback")


def test_a_quota_move_retries_on_a_stale_resource_version() -> None:
    api = ObjectsApi()
    flavor = {"name": "gpu-g6", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "12"}]}
    api.put(CQ, {"metadata": {"name": "gpu-g6"}, "spec": {"resourceGroups": [{"flavors": [flavor]}]}})
    original = api.handle
    stale = [True]

    def once_stale(method: str, raw: str, content_type: str, body: object) -> tuple[int, object]:
        if method == "PATCH" and stale[0]:
            stale[0] = False
            api.put(CQ, api.objects[CQ])  # someone else wrote it between our read and our patch
        return original(method, raw, content_type, body)

    api.handle = once_stale  # type: ignore[method-assign]
    with serving(api):
        record = act.move_quota(KubeApi(api.url, "t"), G6, "node-a", sign=-1, entry={"at": 1.0}, now=1.0)
    assert list(record.nodes) == ["node-a"]
    assert api.objects[CQ]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "8"
    assert [m for m, _ in api.requests].count("PATCH") == 2

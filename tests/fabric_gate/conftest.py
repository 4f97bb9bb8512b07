"""A cluster the gate's processes report to: a loopback API server holding an admitted Job `gated` with one Running
pod per node (gated-NODE on node-0..node-3, g6 GPU workers), its ClusterQueue, and the real remediation controller
polling it every 0.1 s (fabric_controller/), as the gate meets them in a cluster."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fabric_controller.config import ControllerConfig, GroupConfig
from fabric_controller.loop import Controller
from tests.fabric_controller.objects_api import ObjectsApi, serving
from tests.fabric_controller.test_loop import add_node, add_pod, add_workload, owner
from training.kube_api import KubeApi

NODES = ["node-0", "node-1", "node-2", "node-3"]
CQ = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6"


@pytest.fixture
def controlled() -> Iterator[ObjectsApi]:
    """An admitted Job `gated` with one Running pod per node (gated-NODE), four g6 nodes, its ClusterQueue, and the
    controller polling every 0.1 s until the test ends."""
    api = ObjectsApi()
    api.put(
        "/apis/batch/v1/namespaces/training/jobs/gated",
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "gated", "uid": "job-uid"}},
    )
    add_workload(api, "training", "job-uid")
    for node in NODES:
        add_node(api, node)
        add_pod(api, "training", f"gated-{node}", node, [owner("batch/v1", "Job", "gated", "job-uid")])
    flavor = {"name": "gpu-g6", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "16"}]}
    api.put(CQ, {"metadata": {"name": "gpu-g6"}, "spec": {"resourceGroups": [{"flavors": [flavor]}]}})
    config = ControllerConfig(("training",), {"g6": GroupConfig("g6", "gpu-g6", "gpu-g6", {"nvidia.com/gpu": "4"})})
    stop = threading.Event()
    with serving(api):
        controller = Controller(KubeApi(api.url, "controller"), config, log=lambda _: None)

        def poll() -> None:
            while not stop.wait(0.1):
                controller.tick()

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield api
        finally:
            stop.set()
            thread.join(5)

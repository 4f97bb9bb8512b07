"""k8s/system_pods.py: the Ray pods on the system nodes as the charts write them, and the synth-time refusal of an
environment whose system nodes cannot hold them all at once (issue 22 #1)."""

from __future__ import annotations

import dataclasses
import hashlib

import cdk8s
import pytest

from infra.spec import ENVIRONMENTS, ConfigError, Scaling, SystemNodeGroupConfig
from infra.spec.system_room import SystemPod
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.main import build
from k8s.system_pods import ray_system_pods

DIGEST = "sha256:" + hashlib.sha256(b"test manifest for the system pods").hexdigest()
LOCK = ImageLock.load().with_digest("ray-train", DIGEST).with_digest("nvrx-train", DIGEST)


def test_the_heads_and_the_submitter_as_the_charts_write_them() -> None:
    from k8s.charts.ray import RayClusterChart, RayJobChart
    from k8s.workloads import RayFinetuneJob

    dev = ENVIRONMENTS["dev"]
    app = cdk8s.App()
    cluster = RayClusterChart(app, "c", environment=dev, lock=LOCK)
    job = RayJobChart(app, "j", environment=dev, lock=LOCK, job=RayFinetuneJob())
    assert ray_system_pods(dev, "RayCluster", "training", cluster.spec) == [
        SystemPod(name="RayCluster training head", cpu_millis=2000, memory_mib=8192)
    ]
    assert ray_system_pods(dev, "RayJob", "qwen-finetune", job.spec) == [
        SystemPod(name="RayJob qwen-finetune head", cpu_millis=2000, memory_mib=8192),
        SystemPod(name="RayJob qwen-finetune submitter", cpu_millis=200, memory_mib=512),
    ]
    # The shape issue 22 found: the claim on the head, the autoscaler sidecar beside it.
    old = {**cluster.spec, "enableInTreeAutoscaling": True}
    old["autoscalerOptions"] = {"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}
    head = old["headGroupSpec"]["template"]["spec"]
    head["volumes"] = [*head["volumes"], {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}}]
    assert ray_system_pods(dev, "RayCluster", "training", old) == [
        SystemPod(name="RayCluster training head", cpu_millis=2500, memory_mib=8704, zone_pinned=True)
    ]


def test_synth_refuses_an_environment_whose_system_nodes_cannot_hold_both_heads() -> None:
    small = dataclasses.replace(
        ENVIRONMENTS["dev"], system_nodes=SystemNodeGroupConfig(scaling=Scaling(min_size=1, desired_size=2, max_size=3))
    )
    with pytest.raises(ConfigError) as error:
        build(cdk8s.App(), small, check_lock(LOCK))  # with the built NVRx images' placeholders
    assert error.value.field == "dev.system_nodes"
    assert (
        "RayCluster training head (2000m, 8192Mi) may use the 1 system node(s), each with 2375m and 13476Mi after the "
        "add-on pods, and stays Pending when node 0 (us-west-2a) holds RayJob qwen-finetune head"
    ) in str(error.value)

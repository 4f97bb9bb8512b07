"""`trainctl drain` against the loopback Kubernetes API (tests/trainctl/fake_cluster.py): Jobs, RayJobs and
RayClusters removed, Kueue Workloads gone, claims released, then the exit code says it is safe to destroy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainctl.fake_cluster import KUEUE_FINALIZER, FakeCluster
from tests.trainctl.test_submit import write_kubeconfig
from trainctl.cli import main


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    server = FakeCluster()
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert server.handler_errors == []


def _workloads(cluster: FakeCluster) -> None:
    """What a running environment holds: an NVRx Job in `training`, a RayJob with its own RayCluster and the
    long-lived RayCluster `training` in `ray`, each admitted by Kueue, their pods mounting the claims."""
    nvrx = cluster.job("nvrx-fsdp", "training")
    cluster.workload("job-nvrx-fsdp-1a2b3", "training", nvrx)
    for index in range(2):
        cluster.pod(f"nvrx-fsdp-{index}", "training", nvrx, claim="checkpoints")
    finetune = cluster.rayjob("qwen-finetune", "ray")
    own = cluster.raycluster("qwen-finetune-abcde", "ray", owner=finetune)
    cluster.workload("rayjob-qwen-finetune-4c5d6", "ray", finetune)
    cluster.pod("qwen-finetune-abcde-head", "ray", own, claim="checkpoints")
    long_lived = cluster.raycluster("training", "ray")
    cluster.workload("raycluster-training-7e8f9", "ray", long_lived)
    cluster.pod("training-head", "ray", long_lived, claim="checkpoints")
    cluster.pod("training-g6-worker-a", "ray", long_lived, claim="checkpoints")
    for namespace in ("training", "ray"):
        cluster.claim("checkpoints", namespace)


def _drain(cluster: FakeCluster, tmp_path: Path, *extra: str) -> int:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.url)
    return main(["drain", "--kubeconfig", str(kubeconfig), "--timeout", "20", "--poll-interval", "0.05", *extra])


def test_drain_removes_the_workloads_and_says_it_is_safe_to_destroy(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _workloads(cluster)
    assert _drain(cluster, tmp_path, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["safe_to_destroy"] is True
    assert report["left"] == []
    # RayJobs first (KubeRay deletes their clusters), then the other RayClusters, then Jobs, their pods in the
    # background.
    assert cluster.deletes == [
        "RayJob ray/qwen-finetune Background",
        "RayCluster ray/training Background",
        "Job training/nvrx-fsdp Background",
    ]
    for plural in ("jobs", "rayjobs", "rayclusters", "workloads", "pods"):
        assert cluster.names(plural) == [], plural
    # The claims stay (a destroy deletes them with the Storage stack), released: no pod mounts them.
    assert cluster.names("persistentvolumeclaims") == ["ray/checkpoints", "training/checkpoints"]


def test_release_claims_deletes_them_once_no_pod_mounts_them(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _workloads(cluster)
    assert _drain(cluster, tmp_path, "--release-claims") == 0
    out = capsys.readouterr().out
    assert "released claim training/checkpoints" in out
    assert "safe to destroy" in out
    assert cluster.names("persistentvolumeclaims") == []


def test_workloads_whose_controller_is_gone_are_named_and_fail(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kueue uninstalled first (the order CloudFormation used when the namespaces did not depend on its chart):
    the Workloads keep their finalizer and a stack delete would wait for ever."""
    _workloads(cluster)
    cluster.kueue_running = False
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.url)
    code = main(["drain", "--kubeconfig", str(kubeconfig), "--timeout", "0.5", "--poll-interval", "0.05"])
    out = capsys.readouterr().out
    assert code == 1
    assert "safe to destroy" not in out
    for workload in ("job-nvrx-fsdp-1a2b3", "rayjob-qwen-finetune-4c5d6", "raycluster-training-7e8f9"):
        assert workload in out
    assert f"finalizers {KUEUE_FINALIZER}" in out
    assert cluster.names("jobs") == []


def test_nothing_to_drain_is_safe(cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _drain(cluster, tmp_path) == 0
    out = capsys.readouterr().out
    assert "nothing to delete" in out
    assert "safe to destroy" in out


def test_namespace_flags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drain", "--env", "dev", "--namespace", "training"]) == 2
    assert "--namespace and --ray-cluster do not apply" in capsys.readouterr().err

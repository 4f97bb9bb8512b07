"""The cluster rehearsal end to end (`--env`): pods run as processes on this machine only once the scheduler
binds them to a node of the environment, see that node through the Downward API, stay Pending with
kube-scheduler's reason otherwise, and lose their node with --kill-node. Hand-made tiny Jobs; the placement
logic itself is tested purely in test_scheduler.py and test_nodes.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rehearse import Options, Rehearsal, RehearsalError
from rehearse.cluster.placement import NodeKill
from rehearse.cluster.session import run_on_environment
from trainctl.cli import main

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
NS = "t"
GPU_POD = {
    "nodeSelector": {"role": "gpu-worker", "platform/gpu-group": "g6"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def job(name: str, script: str, *, resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    pod_spec = spec.pop("pod", {})
    container = {
        "name": "main",
        "image": "example.invalid/tiny:1",
        "command": ["python", "-c", textwrap.dedent(script)],
        "resources": resources or {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "env": [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
    }
    template = {"spec": {"restartPolicy": "Never", "containers": [container], **pod_spec}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 0, "template": template, **spec},
    }


def rehearse(
    tmp_path: Path, *objects: dict[str, Any], cluster: dict[str, Any] | None = None, **options: Any
) -> Rehearsal:
    options.setdefault("backoff_base_s", 0.0)
    options.setdefault("timeout_s", 60.0)
    opts = Options(output_dir=tmp_path / "out", **options)
    return run_on_environment(list(objects), opts, environment="dev", **(cluster or {}))


def test_a_pod_runs_on_a_node_it_fits_and_one_too_big_stays_pending_with_the_schedulers_reason(
    tmp_path: Path,
) -> None:
    fits = job(
        "fits",
        "import os; print('node', os.environ['NODE'], os.environ['HOST_IP'])",
        pod={"nodeSelector": {"role": "system"}},
    )
    too_big = job("too-big", "print('never')", resources={"requests": {"cpu": "5"}})
    result = rehearse(tmp_path, fits, too_big, timeout_s=8.0)  # the pending pod waits for it
    ran = result.workload("fits")
    assert ran.state == "Complete", ran.message
    pod = ran.pods[0]
    assert pod.node is not None
    assert pod.node.startswith("ip-10-10-")
    assert f"node {pod.node} {pod.node.split('.')[0][3:].replace('-', '.')}" in pod.log()
    waiting = result.workload("too-big")
    assert waiting.state == "Timeout"
    assert waiting.pods[0].node is None
    assert waiting.pods[0].start_s is None
    assert waiting.pods[0].pending_reason == "0/2 nodes are available: 2 Insufficient cpu."
    assert result.exit_code == 1


def test_without_gpu_nodes_a_gpu_pod_is_pending_on_the_taint_and_the_cli_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "gpu.yaml"
    manifest.write_text(json.dumps(job("gpu", "print('x')", pod=GPU_POD)))
    code = main(["rehearse", "--env", "dev", "--timeout", "5", "--output-dir", str(tmp_path / "o"), str(manifest)])
    out = capsys.readouterr().out
    assert code == 1
    assert "cluster: environment dev, time scale 1" in out
    assert "node system-0 ip-10-10-64-11.us-west-2.compute.internal m7i.xlarge us-west-2a" in out
    # No g6 node exists (desired 0), the system nodes select nothing of the pod's.
    assert "Pending: 0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector." in out


def test_node_loss_during_a_job_evicts_its_pod_after_the_toleration_and_the_job_replaces_it(tmp_path: Path) -> None:
    # Index 0 is bound to g6-0 (both nodes equal: the first), index 1 to g6-1 (anti-affinity). g6-0 is lost at
    # cluster second 100; its pod is evicted 40 s (node-monitor grace) + 300 s (default toleration) later with
    # DisruptionTarget, which the Ignore rule does not count; the replacement waits for g6-1 to free up.
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job-name": "loss"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    script = """
        import os, time
        time.sleep(8 if os.environ['JOB_COMPLETION_INDEX'] == '0' else 1)
        print('done on', os.environ['NODE'])
    """
    loss = job(
        "loss",
        script,
        completionMode="Indexed",
        completions=2,
        parallelism=2,
        podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
        pod={**GPU_POD, "affinity": anti},
    )
    result = rehearse(
        tmp_path,
        loss,
        cluster={"gpu_nodes": {"g6": 2}, "time_scale": 100.0, "node_kills": (NodeKill(node="g6-0", seconds=100),)},
        timeout_s=9000.0,
    )
    workload = result.workload("loss")
    assert workload.state == "Complete", (
        f"{workload.message} {[(p.name, p.phase, p.pending_reason) for p in workload.pods]}"
    )
    assert result.cluster is not None
    nodes = {n["alias"]: n for n in result.cluster["nodes"]}
    assert nodes["g6-0"]["ready"] is False
    evicted = workload.pods[0]
    assert evicted.node == nodes["g6-0"]["name"]
    assert evicted.phase == "Failed"
    assert {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"} in evicted.conditions
    assert evicted.end_s is not None
    assert evicted.end_s >= 100 + 40 + 300
    replacement = workload.pods[2]
    assert replacement.name.startswith("loss-0-")
    assert replacement.node == nodes["g6-1"]["name"]
    assert "done on " + nodes["g6-1"]["name"] in replacement.log()


def test_cluster_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "x.yaml"
    manifest.write_text(json.dumps(job("x", "print(1)")))
    assert main(["rehearse", "--nodes", "g6=1", str(manifest)]) == 2
    assert "need --env" in capsys.readouterr().err
    with pytest.raises(RehearsalError, match="time-scale"):
        rehearse(tmp_path, job("x", "print(1)"), cluster={"time_scale": 0})
    with pytest.raises(RehearsalError, match=r"--nodes g6=9"):
        rehearse(tmp_path, job("x", "print(1)"), cluster={"gpu_nodes": {"g6": 9}})
    assert main(["rehearse", "--quota", "g6=1", str(manifest)]) == 2
    assert "need --env" in capsys.readouterr().err
    with pytest.raises(RehearsalError, match=r"--quota: .*GPU group='p9'.*allowed: g6"):
        rehearse(tmp_path, job("x", "print(1)"), cluster={"quota_nodes": {"p9": 1}})
    with pytest.raises(RehearsalError, match=r"--quota: quota nodes of g6=4.*max_size \(3\)"):
        rehearse(tmp_path, job("x", "print(1)"), cluster={"quota_nodes": {"g6": 4}})
    with pytest.raises(RehearsalError, match="hugepages-2Mi"):
        rehearse(tmp_path, job("h", "print(1)", resources={"limits": {"hugepages-2Mi": "10Mi", "memory": "1Gi"}}))

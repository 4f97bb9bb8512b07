"""The fabric gate's taint-and-requeue path through the cluster rehearsal (`trainctl rehearse --env prod`), on CPU.

The emitted NVRx job (2 pods, g6), the emitted fabric-gate chart (its ServiceAccount, RBAC and admission policy) and
the training code, on prod's cluster with 3 g6 nodes. There is no NCCL on CPU, so the gate would report NOT RUN: a
fault is injected at the gate instead (FABRIC_GATE_INJECT=fallback:NODE, the first g6 node: its ranks are faked onto
sockets). What then happens is the real chain: the gate's rank 0 taints that node through the rehearsal's Kubernetes
API (rehearse/cluster/apiserver.py) with the pod's own service-account token, the files' RBAC and admission policy
deciding; it posts the Events; every pod exits 75, which the Job's podFailurePolicy ignores; the Job controller
recreates the pods, Kueue keeps the workload's admission, the scheduler places the new pods away from the node the
taint now marks; the gate passes there and the job trains to completion.

The RayJob path the same way: the emitted RayJob (backoffLimit 1) with the fault injected into its workers; the
driver exits 75, the Ray job FAILS, KubeRay (rehearse/kuberay.py, Retrying) deletes the cluster and creates another,
whose workers the scheduler places off the tainted node; Kueue keeps the admission."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import cdk8s
import pytest
import yaml

from infra.spec import ENVIRONMENTS, get_environment
from k8s.charts.fabric_gate import FabricGateChart
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.charts.ray import RayJobChart, TrainingCodeChart
from k8s.images import ImageLock
from k8s.nvrx_spec import CheckpointPolicy, FtLauncherConfig, InProcessRestart, NvrxFsdpJob
from k8s.workloads import RayFinetuneJob
from rehearse.cluster.nodes import build_nodes
from rehearse.kuberay import dashboard_dependency_error
from trainctl.cli import main
from training.fabric_gate import EXIT_RETRY, INJECT_ENV, TAINT_KEY

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
MINIMAL_RAY = dashboard_dependency_error()


def manifests(model: Path, lock: ImageLock, inject: str) -> list[dict[str, Any]]:
    job = NvrxFsdpJob(
        model=str(model),
        steps=2,
        batch_size=2,
        seq_len=32,
        checkpoint=CheckpointPolicy(every_steps=2),
        gpu_group="g6",
        inprocess=InProcessRestart(max_iterations=1),
        ft_launcher=FtLauncherConfig(max_restarts=0),
    )
    job = replace(job, backoff_limit=0)  # the gate's retry must not count against it
    app = cdk8s.App()
    charts = [
        TrainingCodeChart(app, "training-code", namespaces=("training",)),
        FabricGateChart(app, "fabric-gate", namespaces=("ray", "training")),
        NvrxJobChart(app, "nvrx-fsdp", environment=ENVIRONMENTS["prod"], lock=lock, job=job),
    ]
    objects = [o for chart in charts for o in chart.to_json()]
    (trainer,) = next(o for o in objects if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"]
    trainer["env"].append({"name": INJECT_ENV, "value": inject})
    return objects


def test_a_node_the_gate_fails_is_tainted_and_the_gang_completes_on_the_other_nodes(
    tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str]
) -> None:
    g6 = [n for n in build_nodes(get_environment("prod"), {"g6": 3}) if n.group == "g6"]
    bad = g6[0].name
    files = tmp_path / "manifests.yaml"
    files.write_text(yaml.safe_dump_all(manifests(tiny_model, lock, f"fallback:{bad}")))
    argv = ["rehearse", "--env", "prod", "--nodes", "g6=3", "--ranks-per-pod", "1", "--json"]
    argv += ["--output-dir", str(tmp_path / "out")]
    # --timeout is a hang guard (cluster seconds at scale 1), not a speed assertion.
    argv += ["--host-path", str(tiny_model), "--pod-backoff", "1", "--timeout", "600", str(files)]
    code = main(argv)
    report = json.loads(capsys.readouterr().out)
    (job,) = [w for w in report["workloads"] if w["name"] == "nvrx-fsdp"]
    logs = "\n".join(Path(p["logs"], "trainer.log").read_text(errors="replace")[-2500:] for p in job["pods"])
    assert code == 0, f"{job['state']} {job['message']} {report['notes']}\n{logs}"
    assert job["state"] == "Complete"

    first, rest = job["pods"][:2], job["pods"][2:]
    # The first gang ran on the bad node and the next one; every pod left with the gate's retryable code and the
    # verdict in its termination message.
    assert sorted(p["node"] for p in first) == sorted([bad, g6[1].name])
    assert all(p["exit_codes"]["trainer"] == EXIT_RETRY for p in first), [p["exit_codes"] for p in first]
    assert all(p["messages"]["trainer"].startswith("FABRIC GATE FAIL") for p in first)
    assert all(f"suspect node(s): {bad}" in p["messages"]["trainer"] for p in first)
    # Recreated (podFailurePolicy Ignore: no failure counted), placed off the tainted node, completed there.
    assert len(rest) == 2, [(p["name"], p["node"], p["phase"]) for p in job["pods"]]
    assert {p["node"] for p in rest} == {g6[1].name, g6[2].name}
    assert all(p["phase"] == "Succeeded" for p in rest)
    assert job["status"].get("failed", "0") in ("0", 0), job["status"]

    nodes = {n["name"]: n for n in report["cluster"]["nodes"]}
    assert {"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"} in nodes[bad]["taints"]
    assert all(t["key"] != TAINT_KEY for n in g6[1:] for t in nodes[n.name]["taints"])
    api = report["cluster"]["api"]
    assert {(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in api["events"]} == {
        ("default", "Node", "FabricGateFailed"),
        ("training", "Job", "FabricGateFailed"),
    }
    gate = "system:serviceaccount:training:fabric-gate"
    assert {(r["method"], r["user"], r["code"]) for r in api["requests"]} == {
        ("GET", gate, 200),
        ("PATCH", gate, 200),
        ("POST", gate, 201),
    }
    # Kueue admitted the workload once and kept it: the Job controller, not a requeue, re-placed the pods.
    assert job["admission"]["admitted"] is True
    assert job["admission"]["requeues"] == []


def ray_manifests(model: Path, lock: ImageLock, inject: str) -> list[dict[str, Any]]:
    job = RayFinetuneJob(model=str(model), steps=2, batch_size=2, seq_len=32, gpu_group="g6")
    app = cdk8s.App()
    charts = [
        TrainingCodeChart(app, "training-code", namespaces=("ray",)),
        FabricGateChart(app, "fabric-gate", namespaces=("ray", "training")),
        RayJobChart(app, "ray-finetune", environment=ENVIRONMENTS["prod"], lock=lock, job=job),
    ]
    objects = [o for chart in charts for o in chart.to_json()]
    ray_job = next(o for o in objects if o["kind"] == "RayJob")
    (workers,) = ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    workers["template"]["spec"]["containers"][0]["env"].append({"name": INJECT_ENV, "value": inject})
    return objects


@pytest.mark.skipif(MINIMAL_RAY is not None, reason=f"needs ray[default] where the pods run: {MINIMAL_RAY}")
@pytest.mark.timeout(1800)  # two Ray clusters of 2 CPU ranks each (one per worker pod), one after the other
def test_a_node_the_gate_fails_under_the_ray_job_is_tainted_and_the_retried_cluster_completes_elsewhere(
    tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str]
) -> None:
    # The emitted RayJob (backoffLimit 1, k8s/workloads.py): the gate fails on its first cluster, the driver exits
    # 75, the Ray job FAILS, KubeRay retries on a new RayCluster (rehearse/kuberay.py, Retrying) whose workers the
    # scheduler places off the tainted node; Kueue keeps the admission.
    g6 = [n for n in build_nodes(get_environment("prod"), {"g6": 3}) if n.group == "g6"]
    bad = g6[0].name
    files = tmp_path / "manifests.yaml"
    files.write_text(yaml.safe_dump_all(ray_manifests(tiny_model, lock, f"fallback:{bad}")))
    argv = ["rehearse", "--env", "prod", "--nodes", "g6=3", "--ranks-per-pod", "1", "--json"]
    argv += ["--output-dir", str(tmp_path / "out")]
    argv += ["--host-path", str(tiny_model), "--pod-backoff", "1", "--timeout", "1700", str(files)]
    code = main(argv)
    report = json.loads(capsys.readouterr().out)
    (job,) = [w for w in report["workloads"] if w["name"] == "qwen-finetune"]
    logs = "\n".join(
        f"--- {p['name']} on {p['node']} {p['exit_codes']}\n"
        + "".join(f"[{f.name}] " + f.read_text(errors="replace")[-1500:] for f in sorted(Path(p["logs"]).glob("*.log")))
        for p in job["pods"]
    )
    # The attempts in order (each Retrying note says why the one before ended) ahead of the pods' log tails.
    assert code == 0, f"{job['state']} {job['message']}\n{job['notes']}\n{logs}"
    assert (job["state"], job["status"]["failed"], job["status"]["succeeded"]) == ("Complete", "1", "1")

    workers = [p for p in job["pods"] if p["labels"].get("ray.io/node-type") == "worker"]
    clusters = list(dict.fromkeys(p["labels"]["ray.io/cluster"] for p in workers))
    assert len(clusters) == 2, [(p["name"], p["node"]) for p in workers]
    first = [p for p in workers if p["labels"]["ray.io/cluster"] == clusters[0]]
    retried = [p for p in workers if p["labels"]["ray.io/cluster"] == clusters[1]]
    assert sorted(p["node"] for p in first) == sorted([bad, g6[1].name])
    assert {p["node"] for p in retried} == {g6[1].name, g6[2].name}
    assert any("Retrying" in n for n in job["notes"]), job["notes"]

    nodes = {n["name"]: n for n in report["cluster"]["nodes"]}
    assert {"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"} in nodes[bad]["taints"]
    events = report["cluster"]["api"]["events"]
    assert {(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in events} == {
        ("default", "Node", "FabricGateFailed"),
        ("ray", "RayJob", "FabricGateFailed"),
    }
    assert job["admission"]["admitted"] is True
    assert job["admission"]["requeues"] == []

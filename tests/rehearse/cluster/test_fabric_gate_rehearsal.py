"""The fabric gate's chain through the cluster rehearsal (`trainctl rehearse --env prod`), on CPU, end to end.

The emitted NVRx job (2 pods, g6), the emitted FabricGate objects (the gated pods' ServiceAccount and Role, the
remediation controller's identity, RBAC, admission policy, its code and config ConfigMaps and its Deployment, as the
namespaces' file ships them) and the training code, on prod's cluster with 3 g6 nodes. There is no NCCL on CPU, so the
gate would report NOT RUN: a fault is injected at the gate instead (FABRIC_GATE_INJECT=fallback:NODE, the first g6
node: its ranks are faked onto sockets). What then happens is the real chain: the pod on that node posts a verdict
Event on itself with its own token (it may only create and list Events in its namespace); the controller, a pod of
its Deployment on a system node running fabric_controller from its ConfigMap, reads the pod, its Job and the Kueue
Workload through the rehearsal's API (rehearse/cluster/apiserver.py), taints the node, lowers ClusterQueue gpu-g6 by
one node (the Kueue model's quota with it), posts its Events and answers on the pod; every pod exits 75, which the
Job's podFailurePolicy ignores; the Job controller recreates the pods, Kueue keeps the workload's admission, the
scheduler places the new pods off the tainted node; the gate passes there and the job trains to completion.

The RayJob path the same way: the emitted RayJob (backoffLimit 1) with the fault injected into its workers; the
controller reads the worker pod, its RayCluster and that cluster's RayJob; the driver exits 75, the Ray job FAILS,
KubeRay (rehearse/kuberay.py, Retrying) deletes the cluster and creates another, whose workers the scheduler places
off the tainted node; Kueue keeps the admission."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import cdk8s
import pytest
import yaml

from infra.spec import ENVIRONMENTS, get_environment
from k8s.charts.fabric_gate import FabricGate
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


GATE_NAMESPACES = ("ray", "training")
CONTROLLER = "system:serviceaccount:fabric-gate-system:fabric-gate-controller"
EVENTS = "/api/v1/namespaces/{ns}/events"


def fabric_gate(app: cdk8s.App, lock: ImageLock, env: str = "prod") -> cdk8s.Chart:
    """The FabricGate construct as the namespaces' file holds it (k8s/main.py)."""
    chart = cdk8s.Chart(app, "namespaces")
    FabricGate(chart, "fabric-gate", environment=ENVIRONMENTS[env], lock=lock, namespaces=GATE_NAMESPACES)
    return chart


def gpu_quota(api: dict[str, Any]) -> str:
    """ClusterQueue gpu-g6's nominalQuota of GPUs in the gpu-g6 flavor, as the rehearsal's API server holds it."""
    groups = api["cluster_queues"]["gpu-g6"]["resourceGroups"]
    (quota,) = [
        r["nominalQuota"]
        for g in groups
        for f in g["flavors"]
        if f["name"] == "gpu-g6"
        for r in f["resources"]
        if r["name"] == "nvidia.com/gpu"
    ]
    return str(quota)


def check_the_chain(report: dict[str, Any], namespace: str, workload_kind: str, bad: str) -> None:
    """What the controller, not the gate, did through the API, and who asked for what."""
    api = report["cluster"]["api"]
    controller = [w for w in report["workloads"] if w["name"] == "fabric-gate-controller"]
    assert [(w["kind"], w["state"]) for w in controller] == [("Deployment", "Ready")], controller
    (pod,) = controller[0]["pods"]
    assert pod["restarts"] == 0, pod  # the controller never crashed
    nodes = {n["name"]: n for n in report["cluster"]["nodes"]}
    assert nodes[pod["node"]]["group"] != "g6", "the controller runs on a system node"
    assert {"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"} in nodes[bad]["taints"]
    assert [a for a in api["actions"] if " patched node " in a] == [
        a for a in api["actions"] if a.startswith(f"{CONTROLLER} patched node {bad} ")
    ]
    assert any(a.startswith(f"{CONTROLLER} patched node {bad} ") for a in api["actions"]), api["actions"]
    # One node's quota (a g6.12xlarge's 4 GPUs) out of ClusterQueue gpu-g6, recorded in its annotation.
    assert gpu_quota(api) == "8", api["cluster_queues"]
    taken = json.loads(api["cluster_queues"]["gpu-g6"]["annotations"]["fabric-gate.platform/taken"])
    assert list(taken["nodes"]) == [bad]
    events = sorted((e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in api["events"])
    assert events == sorted(
        [
            (namespace, "Pod", "FabricGateFailed"),
            ("default", "Node", "FabricGateNodeTaken"),
            (namespace, workload_kind, "FabricGateNodeTaken"),
            (namespace, "Pod", "FabricGateNodeTaken"),
        ]
    ), api["events"]
    gate = f"system:serviceaccount:{namespace}:fabric-gate"
    asked: dict[str, set[tuple[str, str]]] = {}
    for r in api["requests"]:
        asked.setdefault(r["user"], set()).add((r["method"], r["path"].split("?")[0]))
    assert set(asked) == {gate, CONTROLLER}, set(asked)
    assert asked[gate] == {("POST", EVENTS.format(ns=namespace)), ("GET", EVENTS.format(ns=namespace))}
    assert ("PATCH", f"/api/v1/nodes/{bad}") in asked[CONTROLLER]
    assert ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/gpu-g6") in asked[CONTROLLER]
    refused = [r for r in api["requests"] if r["code"] >= 400]
    assert refused == [], refused


def manifests(model: Path, lock: ImageLock, inject: str, env: str = "prod") -> list[dict[str, Any]]:
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
        fabric_gate(app, lock, env),
        NvrxJobChart(app, "nvrx-fsdp", environment=ENVIRONMENTS[env], lock=lock, job=job),
    ]
    objects = [o for chart in charts for o in chart.to_json()]
    (trainer,) = next(o for o in objects if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"]
    trainer["env"].append({"name": INJECT_ENV, "value": inject})
    return objects


# Each environment's cluster model: dev's g6 group holds its gang of 2 and the spare (max_size 3), as prod's does.
@pytest.mark.parametrize("env", ["prod", "dev"])
def test_a_node_the_gate_fails_is_tainted_and_the_gang_completes_on_the_other_nodes(
    tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str], env: str
) -> None:
    g6 = [n for n in build_nodes(get_environment(env), {"g6": 3}) if n.group == "g6"]
    bad = g6[0].name
    files = tmp_path / "manifests.yaml"
    files.write_text(yaml.safe_dump_all(manifests(tiny_model, lock, f"fallback:{bad}", env)))
    argv = ["rehearse", "--env", env, "--nodes", "g6=3", "--ranks-per-pod", "1", "--json"]
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
    assert all(t["key"] != TAINT_KEY for n in g6[1:] for t in nodes[n.name]["taints"])
    check_the_chain(report, "training", "Job", bad)
    # Kueue admitted the workload once and kept it: the Job controller, not a requeue, re-placed the pods.
    assert job["admission"]["admitted"] is True
    assert job["admission"]["requeues"] == []


def ray_manifests(model: Path, lock: ImageLock, inject: str, env: str = "prod") -> list[dict[str, Any]]:
    job = RayFinetuneJob(model=str(model), steps=2, batch_size=2, seq_len=32, gpu_group="g6")
    app = cdk8s.App()
    charts = [
        TrainingCodeChart(app, "training-code", namespaces=("ray",)),
        fabric_gate(app, lock, env),
        RayJobChart(app, "ray-finetune", environment=ENVIRONMENTS[env], lock=lock, job=job),
    ]
    objects = [o for chart in charts for o in chart.to_json()]
    ray_job = next(o for o in objects if o["kind"] == "RayJob")
    (workers,) = ray_job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    workers["template"]["spec"]["containers"][0]["env"].append({"name": INJECT_ENV, "value": inject})
    return objects


# A pod of no workload, in another namespace, that tries the first Ray head it can name on the dashboard, GCS and
# client ports, as any pod of the cluster could (issue 38): the head's NetworkPolicies must refuse it each one.
STRANGER = """
import errno, socket, time
seen, deadline = {}, time.time() + 600
while len(seen) < 3 and time.time() < deadline:
    heads = [line.split()[0] for line in open("/etc/hosts") if "-head-svc.ray.svc.cluster.local" in line]
    for port in (8265, 6379, 10001):
        if heads and port not in seen:
            try:
                socket.create_connection((heads[0], port), timeout=2).close()
                seen[port] = "open"
            except OSError as exc:
                if exc.errno == errno.EACCES:
                    seen[port] = "refused"
    time.sleep(0.5)
print("stranger:", sorted(seen.items()))
"""


def stranger_job() -> dict[str, Any]:
    container = {"name": "main", "image": "example.invalid/stranger:1", "command": ["python", "-c", STRANGER]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "stranger", "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def ray_chain(tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str], env: str) -> None:
    # The emitted RayJob (backoffLimit 1, k8s/workloads.py): the gate fails on its first cluster, the controller takes
    # the node out (it reads the worker pod, its RayCluster and that cluster's RayJob), the driver exits 75, the Ray
    # job FAILS, KubeRay retries on a new RayCluster (rehearse/kuberay.py, Retrying) whose workers the scheduler
    # places off the tainted node; Kueue keeps the admission.
    g6 = [n for n in build_nodes(get_environment(env), {"g6": 3}) if n.group == "g6"]
    bad = g6[0].name
    files = tmp_path / "manifests.yaml"
    files.write_text(yaml.safe_dump_all([*ray_manifests(tiny_model, lock, f"fallback:{bad}", env), stranger_job()]))
    argv = ["rehearse", "--env", env, "--nodes", "g6=3", "--ranks-per-pod", "1", "--json"]
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

    check_the_chain(report, "ray", "RayJob", bad)
    assert job["admission"]["admitted"] is True
    assert job["admission"]["requeues"] == []
    (stranger,) = [w for w in report["workloads"] if w["name"] == "stranger"]
    (pod,) = stranger["pods"]
    said = "".join(f.read_text() for f in Path(pod["logs"]).glob("*.log"))
    assert "stranger: [(6379, 'refused'), (8265, 'refused'), (10001, 'refused')]" in said, said


@pytest.mark.skipif(MINIMAL_RAY is not None, reason=f"needs ray[default] where the pods run: {MINIMAL_RAY}")
@pytest.mark.timeout(1800)  # two Ray clusters of 2 CPU ranks each (one per worker pod), one after the other
def test_a_node_the_gate_fails_under_the_ray_job_is_tainted_and_the_retried_cluster_completes_elsewhere(
    tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str]
) -> None:
    ray_chain(tmp_path, tiny_model, lock, capsys, "prod")


# dev's cluster model too (its g6 group holds the gang and the spare): the full tier only, as the CI list names prod's.
@pytest.mark.skipif(MINIMAL_RAY is not None, reason=f"needs ray[default] where the pods run: {MINIMAL_RAY}")
@pytest.mark.timeout(1800)  # two Ray clusters of 2 CPU ranks each (one per worker pod), one after the other
def test_the_ray_jobs_chain_on_devs_cluster_model(
    tmp_path: Path, tiny_model: Path, lock: ImageLock, capsys: pytest.CaptureFixture[str]
) -> None:
    ray_chain(tmp_path, tiny_model, lock, capsys, "dev")

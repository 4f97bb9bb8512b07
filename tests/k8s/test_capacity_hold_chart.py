"""The hold controller's objects for an environment with a GPU group on a Capacity Block (k8s/charts/capacity_hold.py):
its power is get and patch on the block groups' ClusterQueues by name and Event creation in default; its config
carries the block's end, the stop margin and the lead; it ships every module it imports. Its admission policy is
exercised through the rehearsal's API server (tests/rehearse/cluster/test_apiserver.py)."""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Any

import cdk8s

from capacity_hold.config import HoldConfig
from infra.spec import ENVIRONMENTS, Capacity, CapacityKind, Environment
from k8s.charts.capacity_hold import SOURCES, CapacityHold, hold_config
from k8s.charts.small_controller import ROOT
from k8s.nvrx_spec import CheckpointPolicy, NvrxFsdpJob
from tests.k8s.test_nvrx_chart import LOCK

END = "2026-12-10T11:30Z"


def on_block(environment: Environment, *names: str) -> Environment:
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end=END)
    groups = tuple(
        dataclasses.replace(g, capacity=block) if g.name in names else g for g in environment.gpu_node_groups
    )
    return dataclasses.replace(environment, gpu_node_groups=groups)


def objects(environment: Environment, job: NvrxFsdpJob) -> list[dict[str, Any]]:
    chart = cdk8s.Chart(cdk8s.App(), "namespaces")
    CapacityHold(chart, "hold", environment=environment, lock=LOCK, nvrx_job=job)
    return list(chart.to_json())


def test_the_lead_is_the_jobs_startup_and_steps_to_its_first_checkpoint_where_it_runs() -> None:
    prod = on_block(ENVIRONMENTS["prod"], "p5", "g6")
    job = NvrxFsdpJob(
        gpu_group="p5", step_seconds=1.5, startup_seconds=900, checkpoint=CheckpointPolicy(every_steps=400)
    )
    config = hold_config(prod, job)
    p5, g6 = config.groups["p5"], config.groups["g6"]
    assert (p5.queue, p5.end, p5.stop_margin_s, p5.lead_s) == ("gpu-p5", END, 2400.0, 900 + 400 * 1.5)
    assert "job nvrx-fsdp's first checkpoint" in p5.lead
    # No checkpointing job runs on g6: Kueue's waitForPodsReady timeout alone.
    assert g6.lead_s == 1200.0
    assert "no checkpointing job runs on group g6" in g6.lead
    assert g6.hold_at() == g6.end_s() - 2400 - 1200


def test_its_power_is_the_block_queues_and_events_in_default_only() -> None:
    docs = objects(on_block(ENVIRONMENTS["prod"], "g6"), NvrxFsdpJob(gpu_group="p5"))
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues"],
            "verbs": ["get", "patch"],
            "resourceNames": ["gpu-g6"],
        }
    ]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert (role["metadata"]["namespace"], role["rules"]) == (
        "default",
        [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}],
    )
    subjects = [s for d in docs if d["kind"].endswith("Binding") and "subjects" in d for s in d["subjects"]]
    assert {(s["namespace"], s["name"]) for s in subjects} == {("capacity-hold-system", "capacity-hold-controller")}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["nodeSelector"]) == ("capacity-hold-controller", {"role": "system"})
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    config = HoldConfig.from_json(json.loads(config_map["data"]["config.json"]))
    assert list(config.groups) == ["g6"]


def test_every_module_the_controller_imports_ships_with_it() -> None:
    shipped = {p.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for p in SOURCES}
    for path in SOURCES:
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in ("training", "capacity_hold")
            ):
                assert node.module in shipped, (path, node.module)
    docs = objects(on_block(ENVIRONMENTS["dev"], "g6"), NvrxFsdpJob(step_seconds=1.0))
    (code,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-code")]
    assert {k.replace("--", "/") for k in code["data"]} == set(SOURCES)

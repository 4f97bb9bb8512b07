"""The hold controller's objects for an environment with a GPU group on a Capacity Block (k8s/charts/capacity_hold.py):
its power is get and patch on the block groups' ClusterQueues by name and Event creation in default; its config
carries the block's end, the stop margin and the lead; it ships every module it imports; its objects pass the
manifest gate (no dev or prod manifest carries them). Its policy and the fabric gate controller's ClusterQueue policy,
evaluated with cel-python over the environment's real ClusterQueue, each let one controller change its own fields
only; the patches the rehearsal's API server emulates go through it (tests/rehearse/cluster/test_apiserver.py)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from typing import Any

import cdk8s
import pytest
from celpy.adapter import json_to_cel

from capacity_hold.config import HoldConfig
from capacity_hold.decide import HOLD_ANNOTATION
from gates.manifests import check_namespace_isolation, check_objects, load_crd
from infra.spec import ENVIRONMENTS, Capacity, CapacityKind, Environment
from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM
from k8s.charts import capacity_hold as hold_chart
from k8s.charts import fabric_gate
from k8s.charts.admission_rules import CLUSTER_QUEUE_SPEC_FIELDS
from k8s.charts.capacity_hold import SOURCES, CapacityHold, hold_config
from k8s.charts.fabric_gate import FabricGate
from k8s.charts.namespaces import NamespacesChart
from k8s.charts.small_controller import ROOT
from k8s.nvrx_spec import CheckpointPolicy, NvrxFsdpJob
from k8s.queueing import cluster_queue
from tests.k8s import cel
from tests.k8s.test_fabric_gate_rbac import unshipped_imports
from tests.k8s.test_nvrx_chart import LOCK
from training.fabric_verdict import TAKEN_ANNOTATION

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
    assert unshipped_imports(SOURCES, ("training", "capacity_hold")) == []
    docs = objects(on_block(ENVIRONMENTS["dev"], "g6"), NvrxFsdpJob(step_seconds=1.0))
    (code,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-code")]
    assert {k.replace("--", "/") for k in code["data"]} == set(SOURCES)


def block_namespaces_file() -> list[dict[str, Any]]:
    """The namespaces file's share of a block environment, as k8s/main.py build() adds it: the controller's namespace
    (with its default deny) and the hold controller's objects."""
    prod = on_block(ENVIRONMENTS["prod"], "g6")
    chart = NamespacesChart(
        cdk8s.App(), "namespaces", environment="prod", namespaces=(CAPACITY_HOLD_SYSTEM,), vpc_cidr=prod.network.cidr
    )
    CapacityHold(chart, "hold", environment=prod, lock=LOCK, nvrx_job=NvrxFsdpJob(gpu_group="g6", step_seconds=2.0))
    return list(chart.to_json())


def test_a_block_environments_controller_passes_the_manifest_gate_restricted_and_isolated() -> None:
    # dev and prod have no block, so neither their snapshots nor the gates over dist/ ever see these objects.
    docs = block_namespaces_file()
    found = [(f"namespaces[{i}]", d) for i, d in enumerate(docs)]
    assert check_objects(found) == []
    assert check_namespace_isolation({"namespaces.k8s.yaml": found}) == []
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert (labels["pod-security.kubernetes.io/enforce"], labels["pod-security.kubernetes.io/warn"]) == (
        "restricted",
        "restricted",
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "capacity-hold-system"


def test_the_policies_guard_every_other_field_of_the_vendored_clusterqueue_spec() -> None:
    # The field list is copied from the CRD: a Kueue upgrade adding a field must add it (and both policies guard it).
    crd = load_crd(ROOT / "k8s/crds/kueue-v0.19.2/kueue.x-k8s.io_clusterqueues.yaml")
    (v1beta2,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    fields = set(v1beta2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    assert set(CLUSTER_QUEUE_SPEC_FIELDS) == fields


@functools.cache
def queue_policies() -> dict[str, dict[str, Any]]:
    """The two ClusterQueue policies as the charts emit them, by the controller each binds."""
    chart = cdk8s.Chart(cdk8s.App(), "namespaces")
    prod = on_block(ENVIRONMENTS["prod"], "g6")
    CapacityHold(chart, "hold", environment=prod, lock=LOCK, nvrx_job=NvrxFsdpJob(gpu_group="g6", step_seconds=2.0))
    FabricGate(chart, "gate", environment=prod, lock=LOCK, namespaces=("ray", "training"))
    names = {hold_chart.POLICY: hold_chart.CONTROLLER, fabric_gate.QUEUE_POLICY: fabric_gate.CONTROLLER}
    return {
        names[d["metadata"]["name"]]: d
        for d in chart.to_json()
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] in names
    }


def test_each_queue_policy_matches_its_own_controller_only() -> None:
    users = {
        hold_chart.CONTROLLER: hold_chart.controller_username(),
        fabric_gate.CONTROLLER: fabric_gate.controller_username(),
        "operator": "kubernetes-admin",
    }
    for controller, policy in queue_policies().items():
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
            ["kueue.x-k8s.io"],
            ["clusterqueues"],
            ["UPDATE"],
        )
        (condition,) = policy["spec"]["matchConditions"]
        for who, username in users.items():
            request = json_to_cel({"userInfo": {"username": username}})
            assert bool(cel.program(condition["expression"]).evaluate({"request": request})) is (who == controller)


Where = tuple[str | int, ...]
DROP = object()
STOP: Where = ("spec", "stopPolicy")
HOLD = (STOP, "Hold")
RECORD: tuple[Where, object] = (("metadata", "annotations", HOLD_ANNOTATION), "{}")
TAKEN: tuple[Where, object] = (("metadata", "annotations", TAKEN_ANNOTATION), "{}")
OTHER: Where = ("metadata", "annotations", "example.com/note")
# The g6 flavor's first resource (k8s/queueing.py: the system flavor first, then the group's).
QUOTA = (("spec", "resourceGroups", 0, "flavors", 1, "resources", 0, "nominalQuota"), "99")
COHORT = (("spec", "cohortName"), "all")
LABEL = (("metadata", "labels", "example.com/x"), "y")


def changed(queue: dict[str, Any], *edits: tuple[Where, object]) -> dict[str, Any]:
    queue = copy.deepcopy(queue)
    for path, value in edits:
        node: Any = queue
        for step in path[:-1]:
            node = node[step] if isinstance(step, int) else node.setdefault(step, {})
        if value is DROP:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return queue


def g6_queue() -> dict[str, Any]:
    """The g6 ClusterQueue as CDK applies it (k8s/queueing.py): no stopPolicy, no annotation."""
    prod = ENVIRONMENTS["prod"]
    (g6,) = [g for g in prod.gpu_node_groups if g.name == "g6"]
    return cluster_queue(prod, g6, 3)


PLAIN, HELD, NOTED = "plain", "held", "noted"
OLD = {PLAIN: (), HELD: (HOLD, RECORD), NOTED: ((OTHER, "1"),)}
HOLDER, GATE = hold_chart.CONTROLLER, fabric_gate.CONTROLLER
NOT_ANNOTATION = "may change no annotation but"
CASES: list[tuple[str, str, str, tuple[tuple[Where, object], ...], str | None]] = [
    (HOLDER, "holds with its record", PLAIN, (HOLD, RECORD), None),
    (HOLDER, "releases to None", HELD, ((STOP, "None"), (RECORD[0], DROP)), None),
    (HOLDER, "releases dropping stopPolicy", HELD, ((STOP, DROP), (RECORD[0], DROP)), None),
    (HOLDER, "drains", PLAIN, ((STOP, "HoldAndDrain"), RECORD), "HoldAndDrain would evict"),
    (HOLDER, "moves the quota", PLAIN, (HOLD, QUOTA), "may not change spec.resourceGroups"),
    (HOLDER, "joins a cohort", PLAIN, (COHORT,), "may not change spec.cohortName"),
    (HOLDER, "drops the namespaces", PLAIN, ((("spec", "namespaceSelector"), DROP),), "spec.namespaceSelector"),
    (HOLDER, "adds another annotation", PLAIN, (HOLD, RECORD, (OTHER, "1")), f"{NOT_ANNOTATION} {HOLD_ANNOTATION}"),
    (HOLDER, "removes another's annotation", NOTED, ((OTHER, DROP),), f"{NOT_ANNOTATION} {HOLD_ANNOTATION}"),
    (HOLDER, "labels", PLAIN, (LABEL,), "may not change a ClusterQueue's labels"),
    (HOLDER, "finalizes", PLAIN, ((("metadata", "finalizers"), ["example.com/f"]),), "finalizers"),
    (HOLDER, "owns", PLAIN, ((("metadata", "ownerReferences"), [{"uid": "u"}]),), "ownerReferences"),
    (GATE, "moves the quota with its record", PLAIN, (QUOTA, TAKEN), None),
    (GATE, "holds", PLAIN, (HOLD,), "may not change spec.stopPolicy"),
    (GATE, "lifts a hold", HELD, ((STOP, DROP),), "may not change spec.stopPolicy"),
    (GATE, "drops the hold's record", HELD, ((RECORD[0], DROP),), f"{NOT_ANNOTATION} {TAKEN_ANNOTATION}"),
    (GATE, "joins a cohort", PLAIN, (COHORT,), "may not change spec.cohortName"),
    (GATE, "labels", PLAIN, (LABEL,), "may not change a ClusterQueue's labels"),
]


@pytest.mark.parametrize(
    ("controller", "name", "old", "edits", "message"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES]
)
def test_a_controller_changes_only_its_fields_of_a_real_clusterqueue(
    controller: str, name: str, old: str, edits: tuple[tuple[Where, object], ...], message: str | None
) -> None:
    before = changed(g6_queue(), *OLD[old])
    denied = cel.denied(queue_policies()[controller], before, changed(before, *edits))
    if message is None:
        assert denied == []
    else:
        (only,) = denied
        assert message in only

"""The controller believes a verdict only as far as it can check it (fabric_controller/decide.py), on plain objects."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fabric_controller.config import ControllerConfig, GroupConfig
from fabric_controller.decide import Facts, Gang, Record, Refuse, Take, decide, shifted_quota
from training.fabric_verdict import TAINT_KEY, ReportedVerdict

G6 = GroupConfig("g6", "gpu-g6", "gpu-g6", {"cpu": "44", "memory": "170Gi", "nvidia.com/gpu": "4"})
CONFIG = ControllerConfig(("ray", "training"), {"g6": G6}, max_per_group_per_hour=2)
CLAIM = ReportedVerdict("ev-1", "training", "nvrx-fsdp-0-abc", "pod-uid-1", "node-a", "fallback", "Job/nvrx-fsdp", "m")
GANG = Gang("training", "Job", "nvrx-fsdp", "job-uid", "batch/v1", admitted=True)
NOW = 10_000.0


def node(name: str, *, group: str = "g6", role: str = "gpu-worker", tainted: bool = False) -> dict[str, Any]:
    taints = [{"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"}] if tainted else []
    labels = {"role": role, "platform/gpu-group": group}
    return {"metadata": {"name": name, "uid": f"u-{name}", "labels": labels}, "spec": {"taints": taints}}


def pod(*, uid: str = "pod-uid-1", node_name: str = "node-a", phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": CLAIM.pod, "uid": uid}, "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def facts(**changes: Any) -> Facts:
    base = Facts(pod(), node("node-a"), GANG, [node("node-a"), node("node-b"), node("node-c")], Record(), NOW)
    return replace(base, **changes)


def test_a_gang_member_on_its_own_gated_node_takes_the_node_out() -> None:
    assert decide(CLAIM, facts(), CONFIG) == Take("node-a", G6, GANG)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"pod": None}, "does not exist"),
        ({"pod": pod(uid="other")}, "the Event is about another pod"),
        ({"pod": pod(node_name="node-b")}, "runs on node-b, not on node-a: a pod speaks for its own node"),
        ({"pod": pod(phase="Succeeded")}, "is Succeeded, not Running"),
        ({"gang": None}, "not a member of an admitted gang: no Job or RayCluster owns it"),
        ({"gang": replace(GANG, admitted=False, why="its Workload w is not Admitted")}, "w is not Admitted"),
        ({"node": None}, "node node-a does not exist"),
        ({"node": node("node-a", role="system")}, "not a GPU worker of a gated group"),
        ({"node": node("node-a", group="p5")}, "platform/gpu-group=p5; gated: g6"),
        ({"record": Record({}, (NOW - 100, NOW - 3000))}, "rate bound: 2 node(s) of group g6"),
        ({"group_nodes": [node("node-a"), node("node-b", tainted=True)]}, "the last untainted node of group g6"),
    ],
)
def test_a_claim_the_controller_cannot_check_is_refused_saying_why(changes: dict[str, Any], why: str) -> None:
    decision = decide(CLAIM, facts(**changes), CONFIG)
    assert isinstance(decision, Refuse)
    assert why in decision.why


def test_takes_older_than_an_hour_leave_the_rate_bound() -> None:
    assert isinstance(decide(CLAIM, facts(record=Record({}, (NOW - 3601, NOW - 4000))), CONFIG), Take)


def test_a_node_already_tainted_is_answered_taken_without_a_second_take() -> None:
    tainted = node("node-a", tainted=True)
    # Even at the rate bound and as the last untainted node: nothing more is done to it.
    decision = decide(CLAIM, facts(node=tainted, record=Record({}, (NOW, NOW)), group_nodes=[tainted]), CONFIG)
    assert decision == Take("node-a", G6, GANG, already=True)


def test_the_record_keeps_the_takes_of_the_last_hour() -> None:
    record = Record({}, (NOW - 4000, NOW - 10)).with_take("node-a", {"at": NOW}, NOW)
    assert record.recent == (NOW - 10, NOW)
    assert Record.parse(record.dump()) == record
    assert record.without("node-a").nodes == {}


def queue(*resources: tuple[str, str]) -> dict[str, Any]:
    flavor = {"name": "gpu-g6", "resources": [{"name": n, "nominalQuota": q} for n, q in resources]}
    return {"spec": {"resourceGroups": [{"coveredResources": [n for n, _ in resources], "flavors": [flavor]}]}}


def test_one_node_of_quota_is_taken_from_the_flavor_and_given_back() -> None:
    cq = queue(("cpu", "132"), ("memory", "510Gi"), ("nvidia.com/gpu", "12"), ("vpc.amazonaws.com/efa", "3"))
    lowered = shifted_quota(cq, G6, -1)
    assert [r["nominalQuota"] for r in lowered[0]["flavors"][0]["resources"]] == ["88", "340Gi", "8", "3"]
    raised = shifted_quota({"spec": {"resourceGroups": lowered}}, G6, +1)
    assert raised == cq["spec"]["resourceGroups"]
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "132"  # not mutated


def test_a_quota_it_cannot_subtract_is_refused_never_guessed() -> None:
    with pytest.raises(ValueError, match="different units"):
        shifted_quota(queue(("memory", "522240Mi")), G6, -1)
    with pytest.raises(ValueError, match="not a whole number"):
        shifted_quota(queue(("cpu", "1500m")), G6, -1)
    with pytest.raises(ValueError, match="has no flavor gpu-g6"):
        shifted_quota({"spec": {"resourceGroups": [{"flavors": [{"name": "other"}]}]}}, G6, -1)


def test_the_quota_never_goes_below_zero() -> None:
    assert shifted_quota(queue(("cpu", "10")), G6, -1)[0]["flavors"][0]["resources"][0]["nominalQuota"] == "0"

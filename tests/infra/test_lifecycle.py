"""Issue 23: after the first deploy. A failed Storage deploy can be retried and a teardown finishes (the file
system and the security group its ENIs hold are retained together; workload namespaces go before the
controllers that own their finalizers), a zone move or a Capacity Block switch can be applied (node groups
and PersistentVolumes are named after what CloudFormation replaces), consumers read Platform with a
stated reference strength, and every GPU group has a measured throughput alarm or says it waits for a run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from infra.spec import (
    ENVIRONMENTS,
    Capacity,
    CapacityKind,
    Environment,
    throughput_baselines,
)
from infra.spec.namespaces import TRAINING_NAMESPACES
from infra.stage import PlatformStage
from tests.conftest import cdk_json_context
from tests.helpers import helm_charts, kubernetes_objects, of_type, only

BLOCK = "cr-0123456789abcdef0"


def _depends_closure(template: dict[str, Any], logical_id: str) -> set[str]:
    seen: set[str] = set()
    todo = [logical_id]
    while todo:
        current = todo.pop()
        for dep in template["Resources"][current].get("DependsOn", []):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


# --- finding 1: the file system and the security group its ENIs hold -------------------------------------------


def test_fsx_and_its_security_group_are_retained_together(stack_templates: dict[str, Any], env_name: str) -> None:
    storage = stack_templates[env_name]["Storage"]
    fs_id, fs = only(storage, "AWS::FSx::FileSystem")
    assert (fs["DeletionPolicy"], fs["UpdateReplacePolicy"]) == ("Retain", "Retain")
    (group_ref,) = fs["Properties"]["SecurityGroupIds"]
    group_id = group_ref["Fn::GetAtt"][0]
    group = storage["Resources"][group_id]
    assert group["Type"] == "AWS::EC2::SecurityGroup"
    assert (group.get("DeletionPolicy"), group.get("UpdateReplacePolicy")) == ("Retain", "Retain"), (
        f"{group_id} is deleted while the retained {fs_id} keeps ENIs with it: EC2 refuses, the stack ends "
        "ROLLBACK_FAILED / DELETE_FAILED"
    )


# --- finding 4: namespaces are deleted before the controllers that own their finalizers ----------------------


def test_workload_namespaces_depend_on_the_kueue_and_kuberay_charts(
    stack_templates: dict[str, Any], env_name: str
) -> None:
    platform = stack_templates[env_name]["Platform"]
    charts = helm_charts(platform)
    namespaces = {
        objects[0]["metadata"]["name"]: logical_id
        for logical_id, objects in kubernetes_objects(platform).items()
        if objects[0]["kind"] == "Namespace"
    }
    for spec in TRAINING_NAMESPACES:
        after = _depends_closure(platform, namespaces[spec.name])
        for chart in ("kueue", "kuberay-operator"):
            assert charts[chart]["LogicalId"] in after, (
                f"namespace {spec.name} does not depend on the {chart} chart: CloudFormation deletes them in "
                "parallel and the finalizers of what is in the namespace lose their controller"
            )


# --- finding 5: throughput alarms and the dashboard --------------------------------------------------------------


def test_no_dashboard_widget_is_empty(stack_templates: dict[str, Any], env_name: str) -> None:
    platform = stack_templates[env_name]["Platform"]
    _, dashboard = only(platform, "AWS::CloudWatch::Dashboard")
    body = json.loads(dashboard["Properties"]["DashboardBody"])
    empty = [
        w["properties"]["title"] for w in body["widgets"] if w["type"] == "metric" and not w["properties"]["metrics"]
    ]
    assert empty == [], f"metric widgets without a metric: {empty}"


def test_every_gpu_group_has_a_measured_throughput_alarm_or_waits_for_its_first_run(
    stack_templates: dict[str, Any], env_name: str
) -> None:
    """Issue 37: every GPU group of both environments has a too-slow alarm from a measured record, or a dashboard
    line saying it waits for its first measured run; no alarm threshold without a record behind it."""
    environment = ENVIRONMENTS[env_name]
    body = json.loads(
        only(stack_templates[env_name]["Platform"], "AWS::CloudWatch::Dashboard")[1]["Properties"]["DashboardBody"]
    )
    texts = "\n".join(w["properties"]["markdown"] for w in body["widgets"] if w["type"] == "text")
    measured = {(b.group, b.job): b for b in throughput_baselines.load() if b.environment == env_name}
    for group in environment.gpu_node_groups:
        template = stack_templates[env_name][f"Gpu-{group.name}"]
        throughput = {
            a["Properties"]["AlarmName"]: a["Properties"]
            for a in of_type(template, "AWS::CloudWatch::Alarm").values()
            if "-throughput-" in a["Properties"]["AlarmName"]
        }
        mine = {job: b for (g, job), b in measured.items() if g == group.name}
        assert set(throughput) == {f"{environment.cluster.name}-{group.name}-throughput-{job}" for job in mine}
        for job, baseline in mine.items():
            props = throughput[f"{environment.cluster.name}-{group.name}-throughput-{job}"]
            assert props["Threshold"] == pytest.approx(throughput_baselines.ALARM_FRACTION * baseline.tokens_per_s)
        if not mine:
            assert f"{group.name} ({group.instance_type}): waiting for its first measured run" in texts
            assert f"trainctl baseline record --env {env_name} --group {group.name}" in texts


# --- finding 3: reference strength -------------------------------------------------------------------------------


def test_the_kubectl_service_token_is_a_strong_reference(stack_templates: dict[str, Any], env_name: str) -> None:
    storage = stack_templates[env_name]["Storage"]
    platform = stack_templates[env_name]["Platform"]
    exports = {o["Export"]["Name"]: o["Value"] for o in platform["Outputs"].values() if "Export" in o}
    tokens = {
        json.dumps(r["Properties"]["ServiceToken"])
        for r in storage["Resources"].values()
        if r["Type"].startswith("Custom::AWSCDK-EKS")
    }
    assert tokens, "the Storage stack applies its claim through the kubectl provider"
    for token in map(json.loads, tokens):
        assert "Fn::ImportValue" in token, f"ServiceToken {token} is read weakly: no export lock"
        value = exports[token["Fn::ImportValue"]]
        assert value["Fn::GetAtt"][0].startswith("EksClusterKubectlProviderframeworkonEvent")


def test_cluster_and_vpc_are_strong_the_gpu_subnet_weak(stack_templates: dict[str, Any], env_name: str) -> None:
    """Cluster name, cluster security group and VPC never change with a config change, and their replacement must
    be refused while a consumer uses them; the GPU subnet changes with a zone move, where an export in use would
    block the move (the consumer must switch first), so it stays a weak read."""
    platform = stack_templates[env_name]["Platform"]
    exported = {json.dumps(o["Value"], sort_keys=True) for o in platform["Outputs"].values() if "Export" in o}
    for value in ({"Ref": "EksClusterB2BDED5B"}, {"Fn::GetAtt": ["EksClusterB2BDED5B", "ClusterSecurityGroupId"]}):
        assert json.dumps(value, sort_keys=True) in exported
    weak = {o["OutputName"] for t in stack_templates[env_name].values() for o in _find_all(t, "Fn::GetStackOutput")}
    assert weak, "the GPU subnet is read weakly"
    for name in weak:
        assert "Subnet" in name or "AlarmTopic" in name, name


def _find_all(node: Any, key: str) -> list[Any]:
    found: list[Any] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                found.append(v)
            found += _find_all(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _find_all(v, key)
    return found


# --- finding 2: a zone move and a Capacity Block switch ------------------------------------------------------------


def _synth(environment: Environment, outdir: Path) -> dict[str, dict[str, Any]]:
    stage = PlatformStage(
        cdk.App(context=cdk_json_context(), outdir=str(outdir)), environment.name, environment=environment
    )
    return {stack.node.id: dict(Template.from_stack(stack).to_json()) for stack in stage.stacks}


def _moved() -> Environment:
    return dataclasses.replace(ENVIRONMENTS["prod"], gpu_availability_zone="us-east-2b")


def _capacity_block() -> Environment:
    prod = ENVIRONMENTS["prod"]
    groups = tuple(
        dataclasses.replace(g, capacity=Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id=BLOCK))
        if g.name == "p5"
        else g
        for g in prod.gpu_node_groups
    )
    return dataclasses.replace(prod, gpu_node_groups=groups)


@pytest.fixture(scope="module")
def variants(stack_templates: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        "prod": stack_templates["prod"],
        "moved": _synth(_moved(), tmp_path_factory.mktemp("moved")),
        "block": _synth(_capacity_block(), tmp_path_factory.mktemp("block")),
    }


def _nodegroups(templates: Mapping[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (stack, logical_id): r["Properties"]
        for stack, t in templates.items()
        for logical_id, r in of_type(t, "AWS::EKS::Nodegroup").items()
    }


def _volumes(templates: Mapping[str, dict[str, Any]]) -> set[str]:
    return {
        o["metadata"]["name"]
        for objects in kubernetes_objects(templates["Storage"]).values()
        for o in objects
        if o["kind"] == "PersistentVolume"
    }


@pytest.mark.parametrize("variant", ["moved", "block"])
def test_every_replaced_node_group_has_a_new_name(variants: dict[str, Any], variant: str) -> None:
    before, after = _nodegroups(variants["prod"]), _nodegroups(variants[variant])
    replaced = 0
    for key, props in after.items():
        old = before[key]
        if any(json.dumps(old.get(p)) != json.dumps(props.get(p)) for p in ("Subnets", "CapacityType")):
            replaced += 1
            assert old["NodegroupName"] != props["NodegroupName"], (
                f"{key} must be replaced ({variant}) but keeps the name {props['NodegroupName']}: CloudFormation "
                "cannot update a stack when a custom-named resource requires replacing"
            )
    assert replaced == {"moved": 2, "block": 1}[variant]


def test_persistent_volume_names_follow_the_file_system(variants: dict[str, Any]) -> None:
    assert _volumes(variants["prod"]).isdisjoint(_volumes(variants["moved"])), (
        "the file system is replaced but the PersistentVolumes keep their names: the update is refused "
        "(spec.persistentvolumesource is immutable after creation)"
    )
    assert _volumes(variants["prod"]) == _volumes(variants["block"])


def test_plan_names_each_replacement_and_marks_the_stateful_ones(variants: dict[str, Any]) -> None:
    from infra.spec import AcknowledgedReplacement
    from trainctl.template_plan import plan_templates

    moved = plan_templates(variants["prod"], variants["moved"], acknowledged=())
    replaced = {(c.stack, c.type) for c in moved.replacements}
    assert ("Storage", "AWS::FSx::FileSystem") in replaced
    assert ("Gpu-p5", "AWS::EKS::Nodegroup") in replaced
    assert ("Gpu-g6", "AWS::EKS::Nodegroup") in replaced
    assert ("Platform", "AWS::EKS::Nodegroup") not in replaced  # the system nodes stay
    assert all(c.stateful for c in moved.replacements if c.type in {"AWS::FSx::FileSystem", "AWS::EKS::Nodegroup"})
    assert [c for c in moved.replacements if c.blocked] == []
    renamed = {(o.kind, o.action) for o in moved.kubernetes}
    assert ("PersistentVolume", "remove") in renamed
    assert ("PersistentVolume", "add") in renamed
    assert moved.exit_code == 1, "a stateful replacement without an acknowledgment fails the plan"

    fs = next(c for c in moved.replacements if c.type == "AWS::FSx::FileSystem")
    assert "SubnetIds" in fs.properties
    ack = tuple(
        AcknowledgedReplacement(stack=c.stack, logical_id=c.logical_id, reason="zone move, checkpoints restored")
        for c in moved.replacements
        if c.stateful
    )
    assert plan_templates(variants["prod"], variants["moved"], acknowledged=ack).exit_code == 0

    block = plan_templates(variants["prod"], variants["block"], acknowledged=())
    assert {(c.stack, c.type) for c in block.replacements if c.stateful} == {("Gpu-p5", "AWS::EKS::Nodegroup")}
    p5 = next(c for c in block.replacements if c.stack == "Gpu-p5" and c.type == "AWS::EKS::Nodegroup")
    assert "CapacityType" in p5.properties


def test_plan_refuses_a_custom_named_replacement() -> None:
    """The rule the node-group names follow: a replacement that keeps a literal name cannot be applied."""
    from infra.spec import AcknowledgedReplacement
    from trainctl.template_plan import plan_templates

    before = {
        "Gpu-p5": {
            "Resources": {
                "Ng": {
                    "Type": "AWS::EKS::Nodegroup",
                    "Properties": {"NodegroupName": "ml-prod-p5", "CapacityType": "ON_DEMAND"},
                }
            }
        }
    }
    after = {
        "Gpu-p5": {
            "Resources": {
                "Ng": {
                    "Type": "AWS::EKS::Nodegroup",
                    "Properties": {"NodegroupName": "ml-prod-p5", "CapacityType": "CAPACITY_BLOCK"},
                }
            }
        }
    }
    result = plan_templates(
        before,
        after,
        acknowledged=(
            AcknowledgedReplacement(stack="Gpu-p5", logical_id="Ng", reason="switching p5 to a Capacity Block"),
        ),
    )
    (change,) = result.replacements
    assert change.blocked is not None
    assert "NodegroupName" in change.blocked
    assert result.exit_code == 1, "no acknowledgment makes a custom-named replacement possible"

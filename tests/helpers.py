"""Small helpers for walking synthesized templates."""

from __future__ import annotations

import json
import re
from typing import Any

from gates.outputs import render_manifest


def of_type(template_json: dict[str, Any], cfn_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template_json["Resources"].items() if v["Type"] == cfn_type}


def only(template_json: dict[str, Any], cfn_type: str) -> tuple[str, dict[str, Any]]:
    found = of_type(template_json, cfn_type)
    assert len(found) == 1, f"expected one {cfn_type}, found {sorted(found)}"
    return next(iter(found.items()))


def nodegroup(template_json: dict[str, Any], suffix: str) -> tuple[str, dict[str, Any]]:
    """The node group named <cluster>-<suffix> or <cluster>-<suffix>-<zone>-<capacity> (system, or a GPU
    group's name; infra/spec/replacement_names.py)."""
    found = [
        (k, v)
        for k, v in of_type(template_json, "AWS::EKS::Nodegroup").items()
        if f"-{suffix}-" in v["Properties"]["NodegroupName"] + "-"
    ]
    assert len(found) == 1, f"expected one node group named *-{suffix}, found {[k for k, _ in found]}"
    return found[0]


def launch_template_of(template_json: dict[str, Any], nodegroup_props: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    lt_id = nodegroup_props["LaunchTemplate"]["Id"]["Ref"]
    return lt_id, template_json["Resources"][lt_id]


AWS_MANAGED_POLICY = re.compile(r":iam::aws:policy/([\w+=,.@/-]+)")


def managed_policy_names(role_props: dict[str, Any]) -> set[str]:
    """The AWS managed policies of an AWS::IAM::Role, by name, however the ARN is written (`arn:<partition>:iam::aws:
    policy/<name>` as an Fn::Join over the partition, or inside an Fn::If)."""
    return {
        name for arn in role_props.get("ManagedPolicyArns", []) for name in AWS_MANAGED_POLICY.findall(json.dumps(arn))
    }


def node_role_of(template_json: dict[str, Any], nodegroup_props: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(logical id, resource) of a node group's node role, which the group names by Fn::GetAtt <role>.Arn."""
    role_id = nodegroup_props["NodeRole"]["Fn::GetAtt"][0]
    return role_id, template_json["Resources"][role_id]


def kubernetes_objects(template_json: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every Kubernetes object CDK applies, by logical id of the manifest resource."""
    return {
        logical_id: render_manifest(res["Properties"]["Manifest"])
        for logical_id, res in of_type(template_json, "Custom::AWSCDK-EKS-KubernetesResource").items()
    }


def without_prune_label(obj: dict[str, Any]) -> dict[str, Any]:
    """An object CDK applies, without the prune label the kubectl provider adds (and without labels if none remain)."""
    labels = {k: v for k, v in obj["metadata"].get("labels", {}).items() if not k.startswith("aws.cdk.eks/prune")}
    metadata = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    return {**obj, "metadata": {**metadata, **({"labels": labels} if labels else {})}}


def helm_charts(template_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Helm releases by chart name, with Values parsed."""
    charts = {}
    for logical_id, res in of_type(template_json, "Custom::AWSCDK-EKS-HelmChart").items():
        props = dict(res["Properties"])
        props["Values"] = json.loads(props.get("Values", "{}"))
        props["LogicalId"] = logical_id
        props["DependsOn"] = res.get("DependsOn", [])
        charts[props["Chart"]] = props
    return charts


def resolve(template_json: dict[str, Any], value: Any) -> Any:
    """A value as the producing stack writes it: a cross-stack reference (a weak one, Fn::GetStackOutput of a
    Platform output, or a strong one, Fn::ImportValue of its export `<stack>:<output>`) becomes that output's
    Value in the merged template."""
    if isinstance(value, dict) and "Fn::GetStackOutput" in value:
        return template_json["Outputs"][value["Fn::GetStackOutput"]["OutputName"]]["Value"]
    if isinstance(value, dict) and isinstance(value.get("Fn::ImportValue"), str):
        return template_json["Outputs"][value["Fn::ImportValue"].split(":", 1)[1]]["Value"]
    return value


def stack_of(stack_templates: dict[str, dict[str, Any]], logical_id: str) -> str:
    """The id of the stack (Platform, Storage, Gpu-<group>) whose template holds `logical_id`."""
    found = [name for name, template in stack_templates.items() if logical_id in template["Resources"]]
    assert len(found) == 1, f"{logical_id} in {found}"
    return found[0]

"""The m7i system node group and its launch template."""

from __future__ import annotations

from typing import Any

from infra.spec import ENVIRONMENTS
from tests.helpers import launch_template_of, managed_policy_names, node_role_of, nodegroup, of_type


def _nodegroup(resources: dict[str, Any], env_name: str) -> dict[str, Any]:
    return nodegroup(resources[env_name], "system")[1]["Properties"]


def test_instance_ami_and_label(resources: dict[str, Any], env_name: str) -> None:
    props = _nodegroup(resources, env_name)
    assert props["InstanceTypes"] == ["m7i.xlarge"]
    assert props["AmiType"] == "AL2023_x86_64_STANDARD"
    assert props["Labels"] == {"role": "system"}
    assert props["CapacityType"] == "ON_DEMAND"
    assert "Taints" not in props


def test_sizes_from_the_environment(resources: dict[str, Any], env_name: str) -> None:
    scaling = ENVIRONMENTS[env_name].system_nodes.scaling
    assert _nodegroup(resources, env_name)["ScalingConfig"] == {
        "MinSize": scaling.min_size,
        "DesiredSize": scaling.desired_size,
        "MaxSize": scaling.max_size,
    }


def test_auto_repair_and_one_at_a_time_updates(resources: dict[str, Any], env_name: str) -> None:
    props = _nodegroup(resources, env_name)
    assert props["NodeRepairConfig"] == {"Enabled": True}
    assert props["UpdateConfig"] == {"MaxUnavailable": 1}


def test_private_subnets_in_every_zone(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    private = {
        k
        for k, v in of_type(template, "AWS::EC2::Subnet").items()
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in v["Properties"]["Tags"]
    }
    assert {s["Ref"] for s in _nodegroup(resources, env_name)["Subnets"]} == private


def test_launch_template_requires_imdsv2_with_hop_limit_1(resources: dict[str, Any], env_name: str) -> None:
    # Hop limit 1: IMDSv2 answers stop at the node, so a pod outside the host network gets no token and no
    # node-role credentials; host-network agents (aws-node, the Pod Identity agent) still get theirs.
    lt_id, lt = launch_template_of(resources[env_name], _nodegroup(resources, env_name))
    assert _nodegroup(resources, env_name)["LaunchTemplate"]["Id"] == {"Ref": lt_id}
    data = lt["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpPutResponseHopLimit": 1,
        "HttpTokens": "required",
    }
    # Managed node groups refuse these in their launch template.
    assert "IamInstanceProfile" not in data
    assert "SubnetId" not in data


def test_root_volume_encrypted_gp3(resources: dict[str, Any], env_name: str) -> None:
    _, lt = launch_template_of(resources[env_name], _nodegroup(resources, env_name))
    assert lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/xvda",
            "Ebs": {
                "Encrypted": True,
                "VolumeSize": ENVIRONMENTS[env_name].system_nodes.disk_size_gib,
                "VolumeType": "gp3",
            },
        }
    ]


def test_node_role_leaves_the_vpc_cni_permissions_to_aws_node(resources: dict[str, Any], env_name: str) -> None:
    # The VPC CNI's AmazonEKS_CNI_Policy is on aws-node's own Pod Identity role (tests/infra/test_cluster.py).
    _, role = node_role_of(resources[env_name], _nodegroup(resources, env_name))
    assert managed_policy_names(role["Properties"]) == {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryReadOnly",
    }
    inline = [
        p
        for p in of_type(resources[env_name], "AWS::IAM::Policy").values()
        if {"Ref": _nodegroup(resources, env_name)["NodeRole"]["Fn::GetAtt"][0]} in p["Properties"]["Roles"]
    ]
    assert inline == []

"""EFA GPU node groups: interface layouts, security group, placement, capacity, AMI, subnet, labels."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk.assertions import Template

from infra.nodegroups.efa import EfaNodeGroup
from infra.spec import (
    ENVIRONMENTS,
    Capacity,
    CapacityKind,
    ConfigError,
    GpuNodeGroupConfig,
    Scaling,
)
from infra.stage import PlatformStage
from tests.conftest import cdk_json_context, merged
from tests.helpers import launch_template_of, managed_policy_names, node_role_of, nodegroup, of_type, resolve

# Desired 0: On-Demand GPU groups launch nothing at deploy (issue 13). Max 3: the default gang of 2 and its spare.
IDLE = Scaling(min_size=0, desired_size=0, max_size=3)
RESERVATION = "cr-0123456789abcdef0"

# Written out by hand from AWS's EFA guidance, not computed by the code under test.
EXPECTED_LAYOUTS: dict[str, list[tuple[int, int, str]]] = {
    "p5.48xlarge": [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, 32)],
    "p5e.48xlarge": [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, 32)],
    # EC2 guide (multiple network cards): further interfaces at the next card, device index 1.
    "p4d.24xlarge": [(0, 0, "efa")] + [(card, 1, "efa") for card in range(1, 4)],
    "g6.12xlarge": [(0, 0, "efa")],
}


def _stage(groups: tuple[GpuNodeGroupConfig, ...], name: str = "t") -> dict[str, Any]:
    env = dataclasses.replace(ENVIRONMENTS["prod"], gpu_node_groups=groups)
    stage = PlatformStage(cdk.App(context=cdk_json_context()), name, environment=env)
    return merged({stack.node.id: dict(Template.from_stack(stack).to_json()) for stack in stage.stacks})


@pytest.fixture(scope="module")
def every_type() -> dict[str, Any]:
    groups = tuple(GpuNodeGroupConfig(name=t.split(".")[0], instance_type=t, scaling=IDLE) for t in EXPECTED_LAYOUTS)
    return _stage(groups, "types")


@pytest.fixture(scope="module")
def reserved() -> dict[str, Any]:
    groups = (
        GpuNodeGroupConfig(
            name="odcr",
            instance_type="p5.48xlarge",
            scaling=IDLE,
            capacity=Capacity(kind=CapacityKind.RESERVATION, reservation_id=RESERVATION),
        ),
        GpuNodeGroupConfig(
            name="block",
            instance_type="p5.48xlarge",
            scaling=IDLE,
            capacity=Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0fedcba9876543210"),
        ),
        GpuNodeGroupConfig(
            name="odcrpg",
            instance_type="p5.48xlarge",
            scaling=Scaling(min_size=0, desired_size=2, max_size=3),
            capacity=Capacity(
                kind=CapacityKind.RESERVATION, reservation_id=RESERVATION, placement_group_name="p5-odcr-pg"
            ),
        ),
        GpuNodeGroupConfig(
            name="blockpg",
            instance_type="p5.48xlarge",
            scaling=IDLE,
            capacity=Capacity(
                kind=CapacityKind.CAPACITY_BLOCK,
                reservation_id="cr-0fedcba9876543210",
                placement_group_name="p5-block-pg",
            ),
        ),
    )
    return _stage(groups, "reserved")


def _group(template: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(node group properties, launch template data) of GPU group `name`."""
    ng = nodegroup(template, name)[1]["Properties"]
    return ng, launch_template_of(template, ng)[1]["Properties"]["LaunchTemplateData"]


@pytest.mark.parametrize("instance_type", sorted(EXPECTED_LAYOUTS))
def test_interface_layout(every_type: dict[str, Any], instance_type: str) -> None:
    _, data = _group(every_type, instance_type.split(".")[0])
    found = [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in data["NetworkInterfaces"]]
    assert found == EXPECTED_LAYOUTS[instance_type]


def test_p5_has_32_efa_interfaces_and_one_primary(every_type: dict[str, Any]) -> None:
    _, data = _group(every_type, "p5")
    types = [i["InterfaceType"] for i in data["NetworkInterfaces"]]
    assert types.count("efa-only") == 32
    assert types.count("interface") == 1
    assert len({i["NetworkCardIndex"] for i in data["NetworkInterfaces"]}) == 32


@pytest.mark.parametrize("instance_type", sorted(EXPECTED_LAYOUTS))
def test_every_interface_carries_the_security_groups_and_no_subnet(
    every_type: dict[str, Any], instance_type: str
) -> None:
    name = instance_type.split(".")[0]
    _, data = _group(every_type, name)
    efa_sg = next(
        k
        for k, v in of_type(every_type, "AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"] == f"EFA: all traffic within GPU group {name}"
    )
    assert "SecurityGroupIds" not in data
    assert "SubnetId" not in data
    for interface in data["NetworkInterfaces"]:
        assert [resolve(every_type, g) for g in interface["Groups"]] == [
            {"Fn::GetAtt": [efa_sg, "GroupId"]},
            {"Fn::GetAtt": ["EksClusterB2BDED5B", "ClusterSecurityGroupId"]},
        ]
        assert "SubnetId" not in interface
        assert interface["DeleteOnTermination"] is True


def test_efa_security_group_admits_and_sends_all_traffic_to_itself(every_type: dict[str, Any]) -> None:
    groups = {
        k: v
        for k, v in of_type(every_type, "AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"].startswith("EFA:")
    }
    assert len(groups) == len(EXPECTED_LAYOUTS)
    for sg_id, sg in groups.items():
        ref = {"Fn::GetAtt": [sg_id, "GroupId"]}
        ingress = [r["Properties"] for r in of_type(every_type, "AWS::EC2::SecurityGroupIngress").values()]
        egress = [r["Properties"] for r in of_type(every_type, "AWS::EC2::SecurityGroupEgress").values()]
        mine_in = [r for r in ingress if r["GroupId"] == ref]
        mine_out = [r for r in egress if r["GroupId"] == ref]
        assert [(r["IpProtocol"], r["SourceSecurityGroupId"]) for r in mine_in] == [("-1", ref)]
        assert [(r["IpProtocol"], r["DestinationSecurityGroupId"]) for r in mine_out] == [("-1", ref)]
        # No default allow-all egress to 0.0.0.0/0 on the EFA group itself.
        assert "SecurityGroupEgress" not in sg["Properties"]


def test_cluster_placement_group_for_on_demand(every_type: dict[str, Any]) -> None:
    placement_groups = of_type(every_type, "AWS::EC2::PlacementGroup")
    assert len(placement_groups) == len(EXPECTED_LAYOUTS)
    assert {p["Properties"]["Strategy"] for p in placement_groups.values()} == {"cluster"}
    for instance_type in EXPECTED_LAYOUTS:
        _, data = _group(every_type, instance_type.split(".")[0])
        assert data["Placement"]["GroupName"]["Ref"] in placement_groups
        assert "CapacityReservationSpecification" not in data
        assert "InstanceMarketOptions" not in data


def test_reservation_targets_the_odcr_without_a_placement_group(reserved: dict[str, Any]) -> None:
    assert of_type(reserved, "AWS::EC2::PlacementGroup") == {}
    ng, data = _group(reserved, "odcr")
    assert "Placement" not in data
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    assert "InstanceMarketOptions" not in data
    assert ng["CapacityType"] == "ON_DEMAND"


@pytest.mark.parametrize(("group", "placement"), [("odcrpg", "p5-odcr-pg"), ("blockpg", "p5-block-pg")])
def test_reservation_in_a_placement_group_launches_into_that_group(
    reserved: dict[str, Any], group: str, placement: str
) -> None:
    # An ODCR created in a cluster placement group is used only by instances launched into it.
    _, data = _group(reserved, group)
    assert data["Placement"] == {"GroupName": placement}
    assert "CapacityReservationId" in data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert of_type(reserved, "AWS::EC2::PlacementGroup") == {}  # theirs, not one of ours


def test_reserved_groups_keep_their_sizes(reserved: dict[str, Any]) -> None:
    # A reservation's instances exist: desired > 0 is allowed; a Capacity Block group stays at 0.
    assert _group(reserved, "odcrpg")[0]["ScalingConfig"]["DesiredSize"] == 2
    assert _group(reserved, "blockpg")[0]["ScalingConfig"]["DesiredSize"] == 0


def test_capacity_block_uses_its_market_type_and_capacity_type(reserved: dict[str, Any]) -> None:
    ng, data = _group(reserved, "block")
    assert "Placement" not in data
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0fedcba9876543210"}
    }
    assert ng["CapacityType"] == "CAPACITY_BLOCK"


@pytest.mark.parametrize("instance_type", sorted(EXPECTED_LAYOUTS))
def test_nvidia_ami_with_the_instance_type_in_the_launch_template(
    every_type: dict[str, Any], instance_type: str
) -> None:
    """The aws_eks_v2 workaround: type in the launch template, never in InstanceTypes."""
    ng, data = _group(every_type, instance_type.split(".")[0])
    assert ng["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert "InstanceTypes" not in ng
    assert data["InstanceType"] == instance_type


def test_aws_eks_v2_still_refuses_nvidia_ami_with_p5_in_instance_types() -> None:
    """Pins the bug the workaround exists for. If aws-cdk-lib fixes it, this fails: the
    instance type can then move back into `instance_types`."""
    stack = cdk.Stack(cdk.App(), "Probe")
    vpc = ec2.Vpc(stack, "Vpc")
    cluster = eks.Cluster(
        stack,
        "Cluster",
        version=eks.KubernetesVersion.V1_36,
        vpc=vpc,
        default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
        default_capacity=0,
    )
    with pytest.raises(RuntimeError, match=r"The specified AMI does not match the instance types architecture"):
        eks.Nodegroup(
            stack,
            "P5",
            cluster=cluster,  # type: ignore[arg-type]
            instance_types=[ec2.InstanceType("p5.48xlarge")],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
        )


def test_one_subnet_in_the_gpu_zone(resources: dict[str, Any]) -> None:
    template = resources["prod"]
    gpu_az = ENVIRONMENTS["prod"].gpu_availability_zone
    subnets = of_type(template, "AWS::EC2::Subnet")
    for group in ENVIRONMENTS["prod"].gpu_node_groups:
        ng, _ = _group(template, group.name)
        assert len(ng["Subnets"]) == 1
        subnet = subnets[resolve(template, ng["Subnets"][0])["Ref"]]["Properties"]
        assert subnet["AvailabilityZone"] == gpu_az
        assert {"Key": "aws-cdk:subnet-type", "Value": "Private"} in subnet["Tags"]


def test_taint_and_labels(resources: dict[str, Any], env_name: str) -> None:
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        ng, _ = _group(resources[env_name], group.name)
        assert ng["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"}]
        assert ng["Labels"]["role"] == "gpu-worker"
        assert ng["Labels"]["nvidia.com/gpu.present"] == "true"
        assert ng["Labels"]["platform/instance-type"] == group.instance_type


def test_sizes_repair_and_updates(resources: dict[str, Any], env_name: str) -> None:
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        ng, _ = _group(resources[env_name], group.name)
        assert ng["ScalingConfig"] == {
            "MinSize": group.scaling.min_size,
            "DesiredSize": group.scaling.desired_size,
            "MaxSize": group.scaling.max_size,
        }
        assert ng["NodeRepairConfig"] == {"Enabled": True}
        assert ng["UpdateConfig"] == {"MaxUnavailable": 1}


def test_imds_and_root_volume(resources: dict[str, Any], env_name: str) -> None:
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        _, data = _group(resources[env_name], group.name)
        assert data["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 1,
            "HttpTokens": "required",
        }
        ebs = data["BlockDeviceMappings"][0]["Ebs"]
        assert ebs["VolumeType"] == "gp3"
        assert ebs["VolumeSize"] >= 200
        assert ebs["Encrypted"] is True


@pytest.mark.parametrize("fixture", ["every_type", "reserved"])
def test_gpu_node_roles_leave_the_vpc_cni_permissions_to_aws_node(request: pytest.FixtureRequest, fixture: str) -> None:
    template: dict[str, Any] = request.getfixturevalue(fixture)
    groups = of_type(template, "AWS::EKS::Nodegroup")
    assert len(groups) == (len(EXPECTED_LAYOUTS) if fixture == "every_type" else 4) + 1  # + the system group
    for ng in groups.values():
        role_id, role = node_role_of(template, ng["Properties"])
        assert managed_policy_names(role["Properties"]) == {
            "AmazonEKSWorkerNodePolicy",
            "AmazonEC2ContainerRegistryReadOnly",
        }, role_id


def test_nvme_raid0_nodeconfig_in_user_data(resources: dict[str, Any], env_name: str) -> None:
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        _, data = _group(resources[env_name], group.name)
        user_data = data["UserData"]["Fn::Base64"]
        assert "Content-Type: multipart/mixed" in user_data
        assert "Content-Type: application/node.eks.aws" in user_data
        assert "kind: NodeConfig" in user_data
        assert "strategy: RAID0" in user_data
        # Round-trips as base64 the way EC2 will receive it.
        assert base64.b64decode(base64.b64encode(user_data.encode())).decode() == user_data


def test_gpu_groups_wait_for_network_addons_but_coredns_does_not_wait_for_them(
    assembly: dict[str, Any], stack_templates: dict[str, dict[str, Any]], env_name: str
) -> None:
    # The node group waits for vpc-cni & co. across stacks: CDK makes that a stack dependency
    # (DependsOn cannot name a resource of another template), so each GPU stack follows Platform.
    gpus = [stack for stack in assembly[env_name].values() if stack.id.startswith("Gpu-")]
    assert gpus
    for gpu in gpus:
        assert gpu.dependencies == ("Platform",)
    platform = stack_templates[env_name]["Platform"]
    addons = {a["Properties"]["AddonName"]: k for k, a in of_type(platform, "AWS::EKS::Addon").items()}
    gpu_ids = {
        k for k, ng in of_type(platform, "AWS::EKS::Nodegroup").items() if "NVIDIA" in ng["Properties"]["AmiType"]
    }
    assert gpu_ids == set()  # no GPU node group in Platform, so nothing of it can wait for one
    assert not set(platform["Resources"][addons["coredns"]]["DependsOn"]) & gpu_ids


def test_prod_and_dev_groups(resources: dict[str, Any]) -> None:
    prod = {n["Properties"]["NodegroupName"] for n in of_type(resources["prod"], "AWS::EKS::Nodegroup").values()}
    dev = {n["Properties"]["NodegroupName"] for n in of_type(resources["dev"], "AWS::EKS::Nodegroup").values()}
    # GPU groups are named after their zone and capacity type (infra/spec/replacement_names.py).
    assert prod == {"ml-prod-system", "ml-prod-p5-us-east-2a-od", "ml-prod-g6-us-east-2a-od"}
    assert dev == {"ml-dev-system", "ml-dev-g6-us-west-2a-od"}


# Bad input: clear error, nothing synthesized.


def test_more_efa_interfaces_than_the_type_allows() -> None:
    with pytest.raises(ConfigError) as err:
        GpuNodeGroupConfig(name="g6", instance_type="g6.12xlarge", scaling=IDLE, efa_interfaces=2)
    assert "gpu_node_groups[g6].efa_interfaces=2" in str(err.value)
    assert "1 to 1" in str(err.value)


def test_fewer_efa_interfaces_shrink_the_layout() -> None:
    config = GpuNodeGroupConfig(name="p5", instance_type="p5.48xlarge", scaling=IDLE, efa_interfaces=4)
    assert config.efa_interface_count == 4


def test_capacity_block_without_reservation_id() -> None:
    with pytest.raises(ConfigError, match=r"capacity.reservation_id=None"):
        Capacity(kind=CapacityKind.CAPACITY_BLOCK)


def test_malformed_reservation_id() -> None:
    with pytest.raises(ConfigError, match=r"capacity.reservation_id='cr-xyz'"):
        Capacity(kind=CapacityKind.RESERVATION, reservation_id="cr-xyz")


def test_reservation_id_on_plain_on_demand_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"set kind=CapacityKind.RESERVATION"):
        Capacity(reservation_id=RESERVATION)


def test_root_volume_too_small() -> None:
    with pytest.raises(ConfigError, match=r"gpu_node_groups\[p5\].root_volume_gib=100"):
        GpuNodeGroupConfig(name="p5", instance_type="p5.48xlarge", scaling=IDLE, root_volume_gib=100)


def test_group_spanning_several_subnets_is_refused() -> None:
    stage = PlatformStage(cdk.App(context=cdk_json_context()), "span", environment=ENVIRONMENTS["dev"])
    stack = stage.platform
    with pytest.raises(ConfigError) as err:
        EfaNodeGroup(
            stack,
            "Spanning",
            cluster=stack.cluster.icluster,
            cluster_security_group_id=stack.cluster.cluster.cluster_security_group_id,
            vpc=stack.network.vpc,
            subnets=stack.network.private_subnets,  # every AZ, not the GPU zone
            config=ENVIRONMENTS["dev"].gpu_node_groups[0],
            nodegroup_name="span",
        )
    assert "gpu_node_groups[g6].subnets=['us-west-2a', 'us-west-2b']" in str(err.value)
    assert "EFA traffic does not cross availability zones" in str(err.value)

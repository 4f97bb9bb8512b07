"""The VPC: private everything, NAT egress per environment, endpoints, flow logs."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Match, Template

from infra.network import INTERFACE_ENDPOINTS
from infra.spec import ENVIRONMENTS
from tests.helpers import of_type, only


def _subnets(template_json: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {
        logical_id: res
        for logical_id, res in of_type(template_json, "AWS::EC2::Subnet").items()
        if {"Key": "aws-cdk:subnet-type", "Value": kind} in res["Properties"]["Tags"]
    }


def test_vpc_cidr(templates: dict[str, Template], env_name: str) -> None:
    templates[env_name].has_resource_properties("AWS::EC2::VPC", {"CidrBlock": ENVIRONMENTS[env_name].network.cidr})


def test_one_private_and_one_public_subnet_per_zone(resources: dict[str, Any], env_name: str) -> None:
    config = ENVIRONMENTS[env_name].network
    private = _subnets(resources[env_name], "Private")
    public = _subnets(resources[env_name], "Public")
    assert sorted(s["Properties"]["AvailabilityZone"] for s in private.values()) == sorted(config.availability_zones)
    assert sorted(s["Properties"]["AvailabilityZone"] for s in public.values()) == sorted(config.availability_zones)
    assert {s["Properties"]["CidrBlock"].split("/")[1] for s in private.values()} == {str(config.private_subnet_prefix)}
    assert {s["Properties"]["CidrBlock"].split("/")[1] for s in public.values()} == {str(config.public_subnet_prefix)}
    for subnet in [*private.values(), *public.values()]:
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_private_subnets_tagged_for_internal_load_balancers_only(resources: dict[str, Any], env_name: str) -> None:
    for subnet in _subnets(resources[env_name], "Private").values():
        assert {"Key": "kubernetes.io/role/internal-elb", "Value": "1"} in subnet["Properties"]["Tags"]
    for subnet in _subnets(resources[env_name], "Public").values():
        assert not any(tag["Key"] == "kubernetes.io/role/elb" for tag in subnet["Properties"]["Tags"])


def test_nat_gateway_count_per_environment(templates: dict[str, Template]) -> None:
    templates["dev"].resource_count_is("AWS::EC2::NatGateway", 1)
    templates["prod"].resource_count_is("AWS::EC2::NatGateway", 3)


def test_nat_gateways_live_in_public_subnets_and_private_routes_use_them(
    resources: dict[str, Any], env_name: str
) -> None:
    template = resources[env_name]
    public_ids = set(_subnets(template, "Public"))
    for nat in of_type(template, "AWS::EC2::NatGateway").values():
        assert nat["Properties"]["SubnetId"]["Ref"] in public_ids
    private_defaults = [r for r in of_type(template, "AWS::EC2::Route").values() if "NatGatewayId" in r["Properties"]]
    assert len(private_defaults) == len(ENVIRONMENTS[env_name].network.availability_zones)
    assert all(r["Properties"]["DestinationCidrBlock"] == "0.0.0.0/0" for r in private_defaults)


def test_public_subnets_hold_only_the_nat_gateways(resources: dict[str, Any], env_name: str) -> None:
    """Nothing but NAT gateways may reference a public subnet."""
    template = resources[env_name]
    public_ids = set(_subnets(template, "Public"))
    allowed = {"AWS::EC2::NatGateway", "AWS::EC2::SubnetRouteTableAssociation", "AWS::EC2::Subnet"}
    for logical_id, res in template["Resources"].items():
        if res["Type"] in allowed or res["Type"] == "AWS::EC2::Route":
            continue
        text = str(res.get("Properties", {}))
        leaked = [p for p in public_ids if f"'{p}'" in text]
        assert not leaked, f"{logical_id} ({res['Type']}) references public subnet(s) {leaked}"


def test_s3_gateway_endpoint_on_private_route_tables(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    gateways = [
        e
        for e in of_type(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"]["VpcEndpointType"] == "Gateway"
    ]
    assert len(gateways) == 1
    props = gateways[0]["Properties"]
    assert "s3" in str(props["ServiceName"])
    assert len(props["RouteTableIds"]) == len(ENVIRONMENTS[env_name].network.availability_zones)


def test_interface_endpoints_with_private_dns_in_private_subnets(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    private_ids = set(_subnets(template, "Private"))
    interfaces = [
        e["Properties"]
        for e in of_type(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"]["VpcEndpointType"] == "Interface"
    ]
    services = sorted(str(p["ServiceName"]) for p in interfaces)
    for expected in ("ecr.api", "ecr.dkr", "sts", "logs", "ec2"):
        assert sum(s.endswith(f".{expected}") or f".{expected}'" in s for s in services) == 1, (expected, services)
    assert len(interfaces) == len(INTERFACE_ENDPOINTS)
    for props in interfaces:
        assert props["PrivateDnsEnabled"] is True
        assert {ref["Ref"] for ref in props["SubnetIds"]} == private_ids


def test_endpoint_security_group_admits_https_from_the_vpc_only(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    interfaces = [
        e["Properties"]
        for e in of_type(template, "AWS::EC2::VPCEndpoint").values()
        if e["Properties"]["VpcEndpointType"] == "Interface"
    ]
    groups = {str(p["SecurityGroupIds"]) for p in interfaces}
    assert len(groups) == 1
    sg_id = interfaces[0]["SecurityGroupIds"][0]["Fn::GetAtt"][0]
    ingress = template["Resources"][sg_id]["Properties"]["SecurityGroupIngress"]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"], r["CidrIp"]) for r in ingress] == [
        ("tcp", 443, 443, ENVIRONMENTS[env_name].network.cidr)
    ]


def test_flow_logs_capture_all_traffic_to_a_retained_log_group(
    templates: dict[str, Template], resources: dict[str, Any], env_name: str
) -> None:
    template = templates[env_name]
    vpc_id, _ = only(resources[env_name], "AWS::EC2::VPC")
    template.has_resource_properties(
        "AWS::EC2::FlowLog",
        {
            "ResourceId": {"Ref": vpc_id},
            "ResourceType": "VPC",
            "TrafficType": "ALL",
            "LogDestinationType": "cloud-watch-logs",
            "LogGroupName": Match.any_value(),
        },
    )
    retention = ENVIRONMENTS[env_name].network.flow_log_retention_days
    template.has_resource(
        "AWS::Logs::LogGroup", {"Properties": {"RetentionInDays": retention}, "DeletionPolicy": "Retain"}
    )

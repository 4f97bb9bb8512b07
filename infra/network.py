"""The VPC: private subnets for everything, NAT egress, endpoints, flow logs."""

from __future__ import annotations

from aws_cdk import CrossStackReferences, ReferenceStrength, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.logs import retention_days
from infra.spec import NetworkConfig, endpoints
from infra.trust import confine_library_trust, source_conditions

_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
}
# The list and why: infra/spec/endpoints.py.
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    name: _SERVICES[name] for name in endpoints.INTERFACE_ENDPOINTS
}


class Network(Construct):
    """A VPC whose public subnets hold only NAT gateways; nodes, pods and control-plane ENIs are private."""

    def __init__(self, scope: Construct, construct_id: str, *, config: NetworkConfig) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.cidr),
            availability_zones=list(config.availability_zones),
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=config.public_subnet_prefix,
                    map_public_ip_on_launch=False,
                ),
                ec2.SubnetConfiguration(
                    name="private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=config.private_subnet_prefix,
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(
                    service=ec2.GatewayVpcEndpointAwsService.S3,
                    subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
                )
            },
        )
        # The VPC id is read strongly (an export): it never changes with a config change, and nothing may
        # replace it under the stacks that use it. The subnets stay weak reads (cdk.json): a zone move switches
        # the GPU stacks and Storage to another zone's subnet, and an export of the old one still in use
        # would make Platform's deploy fail before the consumers could switch (infra/stage.py).
        CrossStackReferences.of(self.vpc).produce(ReferenceStrength.STRONG)
        self.private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        for subnet in self.vpc.private_subnets:
            # Internal load balancers only; public subnets get no ELB role tag.
            Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")
        for subnet in self.vpc.public_subnets:
            # aws_eks_v2 tags public subnets for internet-facing load balancers; nothing of
            # ours is exposed, so the tag goes (a Remove outranks the cluster's Add).
            Tags.of(subnet).remove("kubernetes.io/role/elb")

        # One group for all interface endpoints: HTTPS from the VPC's own range (the literal
        # CIDR, so the rule is checkable at synth), no egress.
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="VPC interface endpoints: HTTPS from inside the VPC",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(config.cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
        )
        self.endpoints = {
            name: self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=self.private_subnets,
                private_dns_enabled=True,
                security_groups=[self.endpoint_security_group],
                open=False,
            )
            for name, service in INTERFACE_ENDPOINTS.items()
        }

        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogGroup",
            retention=retention_days(config.flow_log_retention_days),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.flow_log = ec2.FlowLog(
            self,
            "FlowLog",
            resource_type=ec2.FlowLogResourceType.from_vpc(self.vpc),
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        # The role is this account's flow logs' (Amazon VPC User Guide, "IAM role for publishing flow logs to
        # CloudWatch Logs": the flow log's id is not known before it exists, hence vpc-flow-log/*).
        confine_library_trust(
            self.flow_log.iam_role,
            "vpc-flow-logs.amazonaws.com",
            source_conditions(
                self, [Stack.of(self).format_arn(service="ec2", resource="vpc-flow-log", resource_name="*")]
            ),
            "aws_ec2.FlowLog IAMRole",
        )

    def private_subnet_in(self, availability_zone: str) -> ec2.SubnetSelection:
        """The single private subnet of one AZ (EFA node groups must not span zones)."""
        return ec2.SubnetSelection(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[availability_zone]
        )

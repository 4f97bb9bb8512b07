"""VPC endpoints of every environment's VPC: the one list infra/network.py builds, the subnet
address budget (infra/spec/addressing.py) counts and the architecture picture shows.

Interface endpoints keep image pulls, node bootstrap and logging off the NAT gateways (NAT data
processing is billed per GB; ECR layer pulls of multi-GB training images are the bulk of it).
S3 is a free gateway endpoint: ECR stores image layers in S3.
"""

from __future__ import annotations

from types import MappingProxyType

# CDK construct id -> service (com.amazonaws.<region>.<service>).
INTERFACE_ENDPOINTS: MappingProxyType[str, str] = MappingProxyType(
    {
        "EcrApi": "ecr.api",
        "EcrDocker": "ecr.dkr",
        "Sts": "sts",
        "Logs": "logs",
        "Ec2": "ec2",
    }
)
GATEWAY_ENDPOINTS: MappingProxyType[str, str] = MappingProxyType({"S3": "s3"})

"""The Amazon EKS container image registry of each region (add-on images such as the EFA device plugin).

Pulling from the environment's own region keeps image pulls off cross-region NAT traffic and
working through the in-region ECR endpoints. Source: the EKS user guide's "View Amazon container
image registries for Amazon EKS add-ons" (add-ons-images) table, as mirrored by
awslabs/amazon-eks-ami templates/al2/runtime/get-ecr-uri.sh. Opt-in regions have accounts of
their own; every non-opt-in commercial region uses 602401143452 with an in-region registry.
"""

from __future__ import annotations

from types import MappingProxyType

from infra.spec.errors import ConfigError

_COMMERCIAL = "602401143452"

EKS_IMAGE_REGISTRY_ACCOUNTS: MappingProxyType[str, str] = MappingProxyType(
    {
        **{
            region: _COMMERCIAL
            for region in (
                "ap-northeast-1",
                "ap-northeast-2",
                "ap-northeast-3",
                "ap-south-1",
                "ap-southeast-1",
                "ap-southeast-2",
                "ca-central-1",
                "eu-central-1",
                "eu-north-1",
                "eu-west-1",
                "eu-west-2",
                "eu-west-3",
                "sa-east-1",
                "us-east-1",
                "us-east-2",
                "us-west-1",
                "us-west-2",
            )
        },
        "af-south-1": "877085696533",
        "ap-east-1": "800184023465",
        "ap-south-2": "900889452093",
        "ap-southeast-3": "296578399912",
        "ap-southeast-4": "491585149902",
        "ap-southeast-5": "151610086707",
        "ap-southeast-7": "121268973566",
        "ca-west-1": "761377655185",
        "eu-central-2": "900612956339",
        "eu-south-1": "590381155156",
        "eu-south-2": "455263428931",
        "il-central-1": "066635153087",
        "me-central-1": "759879836304",
        "me-south-1": "558608220178",
        "mx-central-1": "730335286997",
        "us-gov-east-1": "151742754352",
        "us-gov-west-1": "013241004608",
    }
)


def eks_image_registry(region: str) -> str:
    """`<account>.dkr.ecr.<region>.amazonaws.com`: the EKS add-on image registry of `region`."""
    try:
        account = EKS_IMAGE_REGISTRY_ACCOUNTS[region]
    except KeyError:
        raise ConfigError(
            "region",
            region,
            sorted(EKS_IMAGE_REGISTRY_ACCOUNTS),
            "add the region's EKS image registry account to infra/spec/registries.py (EKS user guide, add-ons-images)",
        ) from None
    return f"{account}.dkr.ecr.{region}.amazonaws.com"

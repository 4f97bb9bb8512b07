"""Launch-template settings every node group shares."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2

# Hop limit 2: pods on the host network and the VPC CNI reach IMDS through one extra
# hop (the container's network namespace); with 1 they time out. IMDSv2 stays required.
IMDS_HOP_LIMIT = 2


def root_volume(size_gib: int) -> ec2.BlockDevice:
    """Encrypted gp3 root volume; AL2023 EKS AMIs boot from /dev/xvda."""
    return ec2.BlockDevice(
        device_name="/dev/xvda",
        volume=ec2.BlockDeviceVolume.ebs(size_gib, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True),
    )


def imdsv2_metadata() -> dict[str, object]:
    """Keyword arguments for ec2.LaunchTemplate that require IMDSv2 with the hop limit above."""
    return {
        "require_imdsv2": True,
        "http_tokens": ec2.LaunchTemplateHttpTokens.REQUIRED,
        "http_put_response_hop_limit": IMDS_HOP_LIMIT,
        "http_endpoint": True,
    }

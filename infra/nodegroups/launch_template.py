"""Launch-template settings every node group shares."""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2

# IMDSv2 only, hop limit 1, so no pod but a host-network one gets the node role's credentials.
# - IMDS sends its IMDSv2 token answer with the hop limit as IP TTL: "the response to PUT requests has a response
#   hop limit (time to live) of 1 at the IP protocol level" (EC2 user guide, "How Instance Metadata Service
#   Version 2 works"), and the way into a pod's network namespace is one more hop: "going to the container is
#   considered an additional network hop" (EC2 user guide, "IMDS considerations"). With 1, a pod gets no token.
#   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html#instance-metadata-v2-how-it-works
#   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html#imds-considerations
# - A host-network pod shares the node's namespace and crosses no hop: aws-node, kube-proxy, the EKS Pod Identity
#   agent, Fluent Bit and the CloudWatch agent keep their IMDS. IMDSv2 with a hop count of 1 "will cause requests to
#   IMDS from pods to be rejected, provided those pods do not use host networking" (AWS whitepaper "Security
#   Practices for Multi-Tenant SaaS Applications using Amazon EKS").
#   https://docs.aws.amazon.com/whitepapers/latest/security-practices-multi-tenant-saas-applications-eks/restrict-the-use-of-host-networking-and-block-access-to-instance-metadata-service.html
# - EKS Best Practices, "Restrict access to the instance profile assigned to the worker node": require IMDSv2 and
#   set the hop count to 1, in the node group's launch template. Pods that call AWS get a role of their own
#   through EKS Pod Identity (the VPC CNI: infra/cluster.py; the FSx CSI controller; the CloudWatch agent).
#   https://docs.aws.amazon.com/eks/latest/best-practices/identity-and-access-management.html
# - Written out, never left to the AMI: AL2023 AMIs launch with a hop limit of 2 (AL2023 user guide, "IMDSv2").
#   https://docs.aws.amazon.com/linux/al2023/ug/imdsv2.html
# gates/templates.py fails any launch template without it.
IMDS_HOP_LIMIT = 1


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

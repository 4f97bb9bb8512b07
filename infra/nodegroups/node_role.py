"""The node role every node group shares in shape: what the kubelet needs, and not the VPC CNI's permissions."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from infra.library_roles import write_managed_policies

# The node role's AWS managed policies (EKS user guide, "Amazon EKS node IAM role": the kubelet's EC2 describe
# calls and the Pod Identity agent's eks-auth:AssumeRoleForPodIdentity, and image pulls from ECR). The VPC CNI's
# AmazonEKS_CNI_Policy is not here: "If you don't use IRSA or EKS Pod Identity to give permissions to the VPC CNI
# pods, then you must provide permissions for the VPC CNI on the instance role", and the guide recommends a separate
# role for it; aws-node has one through EKS Pod Identity (infra/cluster.py VPC_CNI_POLICY).
# https://docs.aws.amazon.com/eks/latest/userguide/create-node-role.html
NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")


def keep_node_role_to_the_node(nodegroup: eks.Nodegroup) -> iam.CfnRole:
    """Sets the managed policies of the role aws_eks_v2 made for `nodegroup` to NODE_ROLE_POLICIES.

    aws-cdk-lib 2.275.0 (aws-eks-v2/lib/managed-nodegroup.js) creates `NodeGroupRole` with AmazonEKSWorkerNodePolicy,
    AmazonEKS_CNI_Policy and AmazonEC2ContainerRegistryReadOnly and offers no way to leave one out. Passing a role of
    our own instead would change the node group's NodeRole, which replaces the group (createOnly), and the system
    group keeps a literal name (infra/spec/replacement_names.py); so the library's role stays, the same role
    (logical id, ARN), with its policy list written here. cdk-nag and the template both read this list.
    """
    role = nodegroup.node.try_find_child("NodeGroupRole")
    return write_managed_policies(role, NODE_ROLE_POLICIES, "aws_eks_v2.Nodegroup NodeGroupRole")

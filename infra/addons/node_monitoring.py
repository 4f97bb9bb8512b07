"""EKS node monitoring agent: reports GPU, network and kernel faults as node conditions, so
the node groups' auto repair replaces a broken node instead of leaving GPUs idle."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.spec.versions import MANAGED_ADDONS

ADDON = "eks-node-monitoring-agent"


class NodeMonitoringAgent(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.ICluster) -> None:
        super().__init__(scope, construct_id)
        self.addon = eks.Addon(self, "Addon", cluster=cluster, addon_name=ADDON, addon_version=MANAGED_ADDONS[ADDON])

"""Platform namespaces applied by CDK, so charts and claims have somewhere to go: each namespace in one manifest with
its NetworkPolicies (infra/spec/network_policies.py namespace_objects), so it never exists without its default deny."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.spec.namespaces import NamespaceSpec
from infra.spec.network_policies import namespace_objects


class PlatformNamespaces(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        environment: str,
        namespaces: tuple[NamespaceSpec, ...],
        vpc_cidr: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifests = {
            spec.name: eks.KubernetesManifest(
                self,
                spec.name,
                cluster=cluster,
                manifest=namespace_objects(spec, environment, vpc_cidr=vpc_cidr),
                overwrite=True,
            )
            for spec in namespaces
        }

"""Platform namespaces applied by CDK, so charts and claims have somewhere to go."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.spec.namespaces import NamespaceSpec, namespace_manifest


class PlatformNamespaces(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        environment: str,
        namespaces: tuple[NamespaceSpec, ...],
    ) -> None:
        super().__init__(scope, construct_id)
        self.manifests = {
            spec.name: eks.KubernetesManifest(
                self,
                spec.name,
                cluster=cluster,
                manifest=[namespace_manifest(spec, environment)],
                overwrite=True,
            )
            for spec in namespaces
        }

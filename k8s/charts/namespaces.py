"""Training namespaces with Pod Security Standards labels pinned to the cluster version, each followed by its
NetworkPolicies (infra/spec/network_policies.py namespace_policies: the default deny, and what the control plane
calls), and the admission policy that holds the pods of those enforcing Privileged (only to admit a named
capability) to Baseline plus that capability (k8s/charts/pod_security.py): in the same file, so no apply of it
creates a namespace without them."""

from __future__ import annotations

import cdk8s
import cdk8s_plus_36 as kplus
from constructs import Construct

from infra.spec.namespaces import NamespaceSpec, namespace_manifest
from infra.spec.network_policies import namespace_policies
from k8s.charts.network_policies import add_policies
from k8s.charts.pod_security import PodSecurityPolicies


class NamespacesChart(cdk8s.Chart):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: str,
        namespaces: tuple[NamespaceSpec, ...],
        vpc_cidr: str,
    ) -> None:
        super().__init__(scope, construct_id, disable_resource_name_hashes=True)
        self.namespaces = {}
        for spec in namespaces:
            metadata = namespace_manifest(spec, environment)["metadata"]
            self.namespaces[spec.name] = kplus.Namespace(
                self,
                spec.name,
                metadata=cdk8s.ApiObjectMetadata(
                    name=metadata["name"], labels=metadata["labels"], annotations=metadata["annotations"]
                ),
            )
            add_policies(self, namespace_policies(spec, vpc_cidr=vpc_cidr))
        PodSecurityPolicies(self, "pod-security", namespaces=namespaces)

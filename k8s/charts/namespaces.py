"""Training namespaces with Pod Security Standards labels pinned to the cluster version."""

from __future__ import annotations

import cdk8s
import cdk8s_plus_36 as kplus
from constructs import Construct

from infra.spec.namespaces import NamespaceSpec
from infra.spec.versions import POD_SECURITY_VERSION

PSS = "pod-security.kubernetes.io"


def pod_security_labels(spec: NamespaceSpec) -> dict[str, str]:
    return {
        f"{PSS}/enforce": spec.enforce,
        f"{PSS}/enforce-version": POD_SECURITY_VERSION,
        f"{PSS}/warn": spec.warn,
        f"{PSS}/warn-version": POD_SECURITY_VERSION,
        f"{PSS}/audit": spec.warn,
        f"{PSS}/audit-version": POD_SECURITY_VERSION,
    }


class NamespacesChart(cdk8s.Chart):
    def __init__(
        self, scope: Construct, construct_id: str, *, environment: str, namespaces: tuple[NamespaceSpec, ...]
    ) -> None:
        super().__init__(scope, construct_id, disable_resource_name_hashes=True)
        self.namespaces = {
            spec.name: kplus.Namespace(
                self,
                spec.name,
                metadata=cdk8s.ApiObjectMetadata(
                    name=spec.name,
                    labels={
                        "app.kubernetes.io/part-of": "ml-platform",
                        "platform/environment": environment,
                        **pod_security_labels(spec),
                    },
                    annotations={"platform/purpose": spec.purpose},
                ),
            )
            for spec in namespaces
        }

"""KubeRay operator on the system nodes, in its own namespace, reachable only in-cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra.addons.helm import ChartAddOn
from infra.spec.addon_pods import KUBERAY_OPERATOR_CPU, KUBERAY_OPERATOR_MEMORY
from infra.spec.namespaces import KUBERAY
from infra.spec.network_policies import KUBERAY_OPERATOR_RELEASE
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR

# The pinned chart and its release name, which the operator pods' labels carry (the ray namespace admits them).
CHART = KUBERAY_OPERATOR_RELEASE


@dataclass(frozen=True, kw_only=True)
class KubeRayOperatorProps:
    namespace: str = KUBERAY.name
    # Sized for a few hundred RayClusters on an m7i.xlarge (4 vCPU, 16 GiB).
    cpu_request: str = KUBERAY_OPERATOR_CPU
    memory_request: str = KUBERAY_OPERATOR_MEMORY
    cpu_limit: str = "1"
    memory_limit: str = "1Gi"
    extra_values: Mapping[str, Any] = field(default_factory=dict)


def kuberay_values(props: KubeRayOperatorProps) -> dict[str, Any]:
    return {
        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
        "resources": {
            "requests": {"cpu": props.cpu_request, "memory": props.memory_request},
            "limits": {"cpu": props.cpu_limit, "memory": props.memory_limit},
        },
        # The operator's metrics service stays inside the cluster.
        "service": {"type": "ClusterIP"},
        **props.extra_values,
    }


class KubeRayOperator(ChartAddOn):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        props: KubeRayOperatorProps,
        after: Sequence[IDependable],
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            cluster=cluster,
            name=CHART,
            namespace=props.namespace,
            values=kuberay_values(props),
            after=after,
        )

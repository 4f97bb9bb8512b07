"""AWS EFA device plugin: advertises vpc.amazonaws.com/efa on the GPU (EFA) nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra.addons.helm import ChartAddOn, on_gpu_nodes

CHART = "aws-efa-k8s-device-plugin"
RESOURCE = "vpc.amazonaws.com/efa"


@dataclass(frozen=True, kw_only=True)
class EfaDevicePluginProps:
    namespace: str = "kube-system"
    extra_values: Mapping[str, Any] = field(default_factory=dict)


def efa_values(props: EfaDevicePluginProps) -> dict[str, Any]:
    # The chart ships `tolerations: []`: on tainted GPU nodes it would never run and
    # pods asking for vpc.amazonaws.com/efa would stay Pending.
    return {
        **on_gpu_nodes(),
        **props.extra_values,
    }


class EfaDevicePlugin(ChartAddOn):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        props: EfaDevicePluginProps,
        gpu_nodegroups: Sequence[IDependable],
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            cluster=cluster,
            name=CHART,
            namespace=props.namespace,
            values=efa_values(props),
            after=gpu_nodegroups,
        )

"""AWS EFA device plugin: advertises vpc.amazonaws.com/efa on the GPU (EFA) nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.addons.helm import ChartAddOn, on_gpu_nodes
from infra.spec.registries import eks_image_registry

CHART = "aws-efa-k8s-device-plugin"
RESOURCE = "vpc.amazonaws.com/efa"
# The chart's values.yaml (aws/eks-charts stable/aws-efa-k8s-device-plugin, chart v0.5.30):
#   image.repository: 602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin
# i.e. us-west-2 for every cluster; the tag defaults to the chart's appVersion and is left alone.
IMAGE_PATH = "eks/aws-efa-k8s-device-plugin"


@dataclass(frozen=True, kw_only=True)
class EfaDevicePluginProps:
    # The registry host the image is pulled from (the environment region's EKS registry).
    image_registry: str
    namespace: str = "kube-system"
    extra_values: Mapping[str, Any] = field(default_factory=dict)


def efa_props_for_region(region: str) -> EfaDevicePluginProps:
    return EfaDevicePluginProps(image_registry=eks_image_registry(region))


def efa_values(props: EfaDevicePluginProps) -> dict[str, Any]:
    # The chart ships `tolerations: []`: on tainted GPU nodes it would never run and
    # pods asking for vpc.amazonaws.com/efa would stay Pending.
    return {
        **on_gpu_nodes(),
        "image": {"repository": f"{props.image_registry}/{IMAGE_PATH}"},
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
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            cluster=cluster,
            name=CHART,
            namespace=props.namespace,
            values=efa_values(props),
            after=(),
        )

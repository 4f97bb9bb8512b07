"""The one way add-ons install a Helm chart: pinned version from the spec, explicit values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra.spec.scheduling import GPU_NODE_SELECTOR, gpu_toleration
from infra.spec.versions import HELM_CHARTS


def on_gpu_nodes() -> dict[str, Any]:
    """Values that put a DaemonSet on every GPU node and nowhere else: the label every GPU
    group carries, and tolerations for the GPU taint and for critical add-ons."""
    return {
        "nodeSelector": dict(GPU_NODE_SELECTOR),
        "tolerations": [gpu_toleration(), {"key": "CriticalAddonsOnly", "operator": "Exists"}],
    }


def pinned_chart(
    scope: Construct,
    construct_id: str,
    *,
    cluster: eks.ICluster,
    name: str,
    namespace: str,
    values: Mapping[str, Any],
    create_namespace: bool,
    after: Sequence[IDependable] = (),
) -> eks.HelmChart:
    pin = HELM_CHARTS[name]
    chart = eks.HelmChart(
        scope,
        construct_id,
        cluster=cluster,
        chart=pin.chart,
        repository=pin.repository,
        version=pin.version,
        release=name,
        namespace=namespace,
        create_namespace=create_namespace,
        values=dict(values),
        # Roll back a failed install instead of leaving a half-applied release.
        atomic=True,
        wait=True,
        timeout=Duration.minutes(10),
    )
    for dependency in after:
        chart.node.add_dependency(dependency)
    return chart


class ChartAddOn(Construct):
    """An add-on that is one pinned Helm release; subclasses supply name, namespace and values."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        name: str,
        namespace: str,
        values: Mapping[str, Any],
        after: Sequence[IDependable],
    ) -> None:
        super().__init__(scope, construct_id)
        self.values = dict(values)
        self.chart = pinned_chart(
            self,
            "Chart",
            cluster=cluster,
            name=name,
            namespace=namespace,
            values=self.values,
            create_namespace=False,
            after=after,
        )

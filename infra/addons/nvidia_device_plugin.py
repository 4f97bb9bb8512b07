"""NVIDIA device plugin: advertises nvidia.com/gpu on the GPU nodes only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.addons.helm import ChartAddOn, on_gpu_nodes

CHART = "nvidia-device-plugin"


@dataclass(frozen=True, kw_only=True)
class NvidiaDevicePluginProps:
    namespace: str = "kube-system"
    # Merged over the defaults below (top-level keys replace).
    extra_values: Mapping[str, Any] = field(default_factory=dict)


def nvidia_values(props: NvidiaDevicePluginProps) -> dict[str, Any]:
    # The chart's default affinity needs nvidia.com/gpu.present=true (or NFD labels); the
    # GPU node groups carry that label and this selector makes the dependency explicit.
    return {
        **on_gpu_nodes(),
        # Kept explicit: evicting the plugin makes a node's GPUs vanish from the scheduler.
        # (The plugin's failOnInitError default, true, already makes a broken NVML loud.)
        "priorityClassName": "system-node-critical",
        **props.extra_values,
    }


class NvidiaDevicePlugin(ChartAddOn):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        props: NvidiaDevicePluginProps,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            cluster=cluster,
            name=CHART,
            namespace=props.namespace,
            values=nvidia_values(props),
            after=(),
        )

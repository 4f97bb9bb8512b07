"""The CloudWatch metrics the alarms and the dashboard read: names, dimensions, units, sources.

Container Insights with enhanced observability (the amazon-cloudwatch-observability add-on, namespace
ContainerInsights), CloudWatch user guide "Amazon EKS and Kubernetes Container Insights with enhanced
observability metrics" (Container-Insights-metrics-enhanced-EKS.html):

- NVIDIA GPU metrics (add-on >= v1.3.0-eksbuild.1, NVIDIA device plugin and container toolkit on the
  nodes): `node_gpu_utilization` (percent) with dimension sets [ClusterName],
  [ClusterName, InstanceId, NodeName] and [ClusterName, InstanceId, InstanceType, NodeName, GpuDevice].
- EFA metrics (add-on >= v1.5.2-eksbuild.1, EFA device plugin on the cluster): `node_efa_rx_bytes` and
  `node_efa_tx_bytes` (Bytes/Second) with [ClusterName], [ClusterName, InstanceId, NodeName] and
  [ClusterName, InstanceId, InstanceType, NodeName, NetworkInterfaceId].

No dimension names the node group. Only the widest sets carry InstanceType, so a GPU group is selected by
ClusterName + InstanceType in a Metrics Insights query over that schema: exact as long as no two GPU
groups of a cluster share an instance type; groups that do (an ODCR group beside a Capacity Block group
of the same type) each alarm on the nodes of both.

The training metrics are emitted by training/emf.py (the one place their names live) and imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.emf import (
    FABRIC_GATE_FAILED,
    INSTANCE_TYPE,
    JOB_NAME,
    MODEL,
    NAMESPACE,
    NODE_COUNT,
    RESTARTS,
    STEP_TIME,
    THROUGHPUT_DIMENSIONS,
    TOKENS_PER_SECOND,
)

CONTAINER_INSIGHTS = "ContainerInsights"
# Where training pods send their EMF lines (AWS_EMF_AGENT_ENDPOINT): the CloudWatch agent's EMF listener, port
# 25888, which the amazon-cloudwatch-agent-operator opens on the `cloudwatch-agent` Service in `amazon-cloudwatch`
# once the agent config enables emf (operator internal/manifests/collector/ports.go; infra/addons/observability.py).
EMF_AGENT_SERVICE = "cloudwatch-agent"
EMF_AGENT_NAMESPACE = "amazon-cloudwatch"
EMF_PORT = 25888
EMF_AGENT_ENDPOINT = f"tcp://{EMF_AGENT_SERVICE}.{EMF_AGENT_NAMESPACE}:{EMF_PORT}"
# The log group the agent writes an EMF line to when the line names none (training/emf.py names none unless
# AWS_EMF_LOG_GROUP_NAME is set, and no chart sets it): amazon-cloudwatch-agent v1.300069.0 (the image of add-on
# v6.2.0) translator/translate/otel/exporter/awscloudwatchlogs/translator.go defaultLogGroupName. The agent has no
# setting that fixes it: a line's own `_aws.LogGroupName` (or `log_group_name`) wins (infra/addons/observability.py),
# so the agent role may write this group and Container Insights' and nothing else.
EMF_LOG_GROUP = "emf/logs/default"
# Container Insights' log groups, /aws/containerinsights/<cluster>/<kind>: `performance` the agent's (v1.300069.0
# translator/translate/otel/exporter/awsemf/awsemf_default_kubernetes.yaml), the others Fluent Bit's (helm-charts tag
# amazon-cloudwatch-observability-6.2.0 values.yaml containerLogs.fluentBit.config, cloudwatch_logs log_group_name).
CONTAINER_INSIGHTS_LOG_GROUPS = ("performance", "application", "dataplane", "host")


def agent_log_groups(cluster_name: str) -> tuple[str, ...]:
    """Every log group the observability add-on's pods write (the agent role's only log groups)."""
    return (*(f"/aws/containerinsights/{cluster_name}/{kind}" for kind in CONTAINER_INSIGHTS_LOG_GROUPS), EMF_LOG_GROUP)


SOURCE = "docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Container-Insights-metrics-enhanced-EKS.html"


@dataclass(frozen=True, kw_only=True)
class MetricSchema:
    namespace: str
    name: str
    unit: str
    # The dimension set the queries select from (Metrics Insights SCHEMA matches it exactly).
    dimensions: tuple[str, ...]

    def schema(self) -> str:
        return f'SCHEMA("{self.namespace}", {", ".join(sorted(self.dimensions))})'


NODE_GPU_UTILIZATION = MetricSchema(
    namespace=CONTAINER_INSIGHTS,
    name="node_gpu_utilization",
    unit="Percent",
    dimensions=("ClusterName", "InstanceId", "InstanceType", "NodeName", "GpuDevice"),
)
NODE_EFA_RX_BYTES = MetricSchema(
    namespace=CONTAINER_INSIGHTS,
    name="node_efa_rx_bytes",
    unit="Bytes/Second",
    dimensions=("ClusterName", "InstanceId", "InstanceType", "NodeName", "NetworkInterfaceId"),
)
NODE_EFA_TX_BYTES = MetricSchema(
    namespace=CONTAINER_INSIGHTS,
    name="node_efa_tx_bytes",
    unit="Bytes/Second",
    dimensions=("ClusterName", "InstanceId", "InstanceType", "NodeName", "NetworkInterfaceId"),
)
JOB_TOKENS_PER_SECOND = MetricSchema(
    namespace=NAMESPACE, name=TOKENS_PER_SECOND, unit="Count/Second", dimensions=THROUGHPUT_DIMENSIONS[0]
)
JOB_STEP_TIME = MetricSchema(namespace=NAMESPACE, name=STEP_TIME, unit="Seconds", dimensions=THROUGHPUT_DIMENSIONS[0])
JOB_RESTARTS = MetricSchema(namespace=NAMESPACE, name=RESTARTS, unit="Count", dimensions=(INSTANCE_TYPE,))
JOB_FABRIC_GATE_FAILED = MetricSchema(
    namespace=NAMESPACE, name=FABRIC_GATE_FAILED, unit="Count", dimensions=(INSTANCE_TYPE,)
)

__all__ = [
    "CONTAINER_INSIGHTS",
    "CONTAINER_INSIGHTS_LOG_GROUPS",
    "EMF_LOG_GROUP",
    "INSTANCE_TYPE",
    "JOB_FABRIC_GATE_FAILED",
    "JOB_NAME",
    "JOB_RESTARTS",
    "JOB_STEP_TIME",
    "JOB_TOKENS_PER_SECOND",
    "MODEL",
    "NAMESPACE",
    "NODE_COUNT",
    "NODE_EFA_RX_BYTES",
    "NODE_EFA_TX_BYTES",
    "NODE_GPU_UTILIZATION",
    "SOURCE",
    "MetricSchema",
    "agent_log_groups",
]

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

from infra.spec.namespaces import TRAINING_NAMESPACES
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
# Container Insights' log groups, /aws/containerinsights/<cluster>/<kind>: `performance` the agent's (v1.300069.0
# translator/translate/otel/exporter/awsemf/awsemf_default_kubernetes.yaml), the others Fluent Bit's (helm-charts tag
# amazon-cloudwatch-observability-6.2.0 values.yaml containerLogs.fluentBit.config, cloudwatch_logs log_group_name).
CONTAINER_INSIGHTS_LOG_GROUPS = ("performance", "application", "dataplane", "host")

# How the training metrics reach CloudWatch (issue 38). The pods print each EMF line on their container's stdout
# (training/emf.py); the add-on's Fluent Bit tails the container logs of these namespaces only (the workload
# namespaces, infra/spec/namespaces.py) and writes the lines that are EMF objects of the MLPlatform/Training namespace
# to EMF_LOG_GROUP_KIND, a group its configuration names (infra/addons/observability.py). CloudWatch Logs extracts
# the metrics from those events. Nothing listens for EMF on the nodes: the agent's `emf` listener, which wrote a line
# to whatever group the line named, is off.
EMF_SOURCE_NAMESPACES: tuple[str, ...] = tuple(sorted(ns.name for ns in TRAINING_NAMESPACES))
# The kubelet's links to container logs: <pod>_<namespace>_<container>-<id>.log. Pod, namespace and container names
# hold no underscore (DNS labels and subdomains), so `*_<namespace>_*` matches that namespace's containers only.
CONTAINER_LOG_DIR = "/var/log/containers"
# The group of those lines, one per cluster beside Container Insights' own.
EMF_LOG_GROUP_KIND = "training-emf"


def emf_container_log_paths() -> tuple[str, ...]:
    """The globs of the container logs Fluent Bit reads EMF lines from: the workload namespaces' containers only."""
    return tuple(f"{CONTAINER_LOG_DIR}/*_{namespace}_*.log" for namespace in EMF_SOURCE_NAMESPACES)


def emf_log_group(cluster_name: str) -> str:
    """Where the training metrics' EMF lines are written; fixed by Fluent Bit's configuration, not by the line."""
    return f"/aws/containerinsights/{cluster_name}/{EMF_LOG_GROUP_KIND}"


def agent_log_groups(cluster_name: str) -> tuple[str, ...]:
    """Every log group the observability add-on's pods write (the agent role's only log groups)."""
    return (
        *(f"/aws/containerinsights/{cluster_name}/{kind}" for kind in CONTAINER_INSIGHTS_LOG_GROUPS),
        emf_log_group(cluster_name),
    )


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
    "EMF_SOURCE_NAMESPACES",
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
    "emf_container_log_paths",
    "emf_log_group",
]

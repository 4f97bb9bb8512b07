"""Container Insights with enhanced observability: the amazon-cloudwatch-observability EKS managed add-on.

It installs the CloudWatch agent (a DaemonSet, through its operator), Fluent Bit and the DCGM exporter,
and publishes per-node and per-pod NVIDIA GPU and EFA metrics (infra/spec/metrics.py lists the ones the
alarms read). Settings, from the CloudWatch user guide "Install the CloudWatch agent with the Amazon
CloudWatch Observability EKS add-on or the Helm chart" and the add-on's Helm chart
(aws-observability/helm-charts charts/amazon-cloudwatch-observability, values.yaml), which share their
configuration values:

- Permissions through EKS Pod Identity (add-on >= v3.1.0): a role trusted by pods.eks.amazonaws.com,
  associated with the `cloudwatch-agent` service account in `amazon-cloudwatch` (the agent's and, through the
  chart's fluent-bit-daemonset.yaml serviceAccountName, Fluent Bit's; never the node role), carrying
  `agent_policy` below instead of the AWS managed CloudWatchAgentServerPolicy the guide prescribes (that one
  grants log writes and retention on every log group and PutMetricData to any namespace); the association
  exists before the add-on, so the agent never starts without credentials.
- `tolerations`: the chart's root default (`- operator: Exists`) is written out as the GPU taint's
  toleration, so the agent, Fluent Bit and the DCGM exporter run on the tainted GPU nodes (and on the
  untainted system nodes); `--configuration-values` replaces the whole configuration, so nothing here
  relies on a default that a later version may change.
- `agent.config`: `kubernetes.enhanced_container_insights` and `accelerated_compute_metrics` (GPU, EFA)
  on, and `logs.metrics_collected.emf`, which makes the agent listen for embedded-metric-format lines on
  port 25888 TCP/UDP; the operator then adds `emf-tcp`/`emf-udp` to the `cloudwatch-agent` Service
  (amazon-cloudwatch-agent-operator internal/manifests/collector/ports.go). Training pods send their
  throughput lines there (training/emf.py, infra/spec/metrics.py EMF_AGENT_ENDPOINT).
- IMDS at the nodes' hop limit of 1 (infra/nodegroups/launch_template.py): "The CloudWatch Agent relies on IMDS to
  retrieve [region and instance ID], which it uses as metric dimensions"
  (https://github.com/aws/amazon-cloudwatch-agent/pull/1139), and it runs on the host network, where the hop limit
  does not reach it. Chart 6.2.0 (tag amazon-cloudwatch-observability-6.2.0) sets `agent.hostNetwork: true`
  in values.yaml and writes it into the AmazonCloudWatchAgent's `spec.hostNetwork`
  (templates/linux/cloudwatch-agent-custom-resource.yaml), which the operator copies into the DaemonSet
  (aws/amazon-cloudwatch-agent-operator internal/manifests/collector/daemonset.go). The chart did so because
  "This allows the agent pod to hit IMDS for clusters with a restricted hop limit" (aws-observability/helm-charts
  PR #82, https://github.com/aws-observability/helm-charts/pull/82).
  Fluent Bit runs on the host network as well (templates/linux/fluent-bit-daemonset.yaml). The configuration
  below leaves `agent.hostNetwork` at that default.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.cluster import control_plane_log_group_name
from infra.spec.metrics import EMF_AGENT_NAMESPACE, EMF_AGENT_SERVICE, agent_log_groups
from infra.spec.scheduling import gpu_toleration
from infra.spec.versions import MANAGED_ADDONS
from infra.trust import pod_identity_principal

ADDON = "amazon-cloudwatch-observability"
NAMESPACE = EMF_AGENT_NAMESPACE
SERVICE_ACCOUNT = EMF_AGENT_SERVICE

# What the agent role may do, and why nothing more. Add-on v6.2.0 is aws-observability/helm-charts tag
# amazon-cloudwatch-observability-6.2.0 (agent image 1.300069.0b1529, aws-for-fluent-bit 3.4.0); agent paths below are
# aws/amazon-cloudwatch-agent at tag v1.300069.0, whose go.mod replaces the OTel exporters with the fork
# amazon-contributing/opentelemetry-collector-contrib.
#
# Log groups (infra/spec/metrics.py agent_log_groups): the agent writes Container Insights' EMF to
# /aws/containerinsights/<cluster>/performance and the EMF listener's lines to EMF_LOG_GROUP; Fluent Bit, which runs
# as the same service account (templates/linux/fluent-bit-daemonset.yaml), writes .../application, .../dataplane and
# .../host. Where an EMF line lands is the sender's choice, not the agent's: its emf_logs exporter runs with raw_log
# and a fixed fallback group (translator/translate/otel/exporter/awscloudwatchlogs/translator.go setEmfFields:
# RawLog, EmfOnly, LogGroupName = "emf/logs/default", no setting to change or enforce it), and with raw_log the
# exporter takes `_aws.LogGroupName` / `_aws.LogStreamName` (or `log_group_name` / `log_stream_name`) from the line
# itself, using the configured group only when the line names none (exporter/awscloudwatchlogsexporter/exporter.go
# logToCWLog in the fork, read at 3a9a8a0b; the CloudWatch user guide "Using the CloudWatch agent to send embedded
# metric format logs" documents LogGroupName in the payload). So this policy is the control: the role writes these
# five groups only; a line naming any other group (the control-plane group /aws/eks/<cluster>/cluster among them)
# is refused by CloudWatch Logs. The one wildcard left is `:*`, the log streams inside each of its own groups.
#
# Log actions: CreateLogStream, CreateLogGroup when that fails with ResourceNotFound, PutLogEvents (the fork's
# internal/aws/cwlogs/cwlog_client.go CreateStream and PutLogEvents; fluent-bit plugins/out_cloudwatch_logs
# cloudwatch_api.c the same three). PutRetentionPolicy is called only for a configured retention and none is (no
# log_retention in the agent's translated exporters, no log_retention_days in the chart's Fluent Bit outputs);
# neither calls DescribeLogStreams or DescribeLogGroups.
#
# Metrics: no cloudwatch:PutMetricData. The translated configuration's only exporters are awsemf/containerinsights
# and awscloudwatchlogs/emf_logs (translator/tocwconfig/sampleConfig/emf_and_kubernetes_with_gpu_config.yaml), both
# PutLogEvents; CloudWatch extracts the ContainerInsights and MLPlatform/Training metrics from those log events. A
# PutMetricData grant, even one narrowed by a cloudwatch:namespace condition (its only narrowing: the action has no
# resource-level permissions, Service Authorization Reference "Actions, resources, and condition keys for Amazon
# CloudWatch"; CloudWatch user guide iam-cw-condition-keys-namespace.html), would be a permission nothing uses.
#
# EC2: DescribeTags (Auto Scaling group and cluster tags of the node) and DescribeVolumes (EBS volume ids of its
# devices), the fork's receiver/awscontainerinsightreceiver/internal/host/ec2tags.go and ebsvolume.go; neither has
# resource-level permissions (Service Authorization Reference, Amazon EC2), so Resource is "*". The managed policy's
# xray:* (traces) and ssm:GetParameter on AmazonCloudWatch-* (an SSM-stored agent configuration) serve nothing here.
LOG_WRITE_ACTIONS = ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents")
EC2_READ_ACTIONS = ("ec2:DescribeTags", "ec2:DescribeVolumes")


def agent_policy(scope: Construct, cluster_name: str) -> iam.PolicyDocument:
    """The agent role's only policy: log writes on its own groups (and their streams), EC2 describes for metadata."""
    stack = Stack.of(scope)
    assert control_plane_log_group_name(cluster_name) not in agent_log_groups(cluster_name)
    group_arns = [
        stack.format_arn(
            service="logs", resource="log-group", resource_name=group, arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        for group in agent_log_groups(cluster_name)
    ]
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid="OwnLogGroups",
                actions=list(LOG_WRITE_ACTIONS),
                # The group itself (CreateLogGroup, CreateLogStream) and its streams (PutLogEvents).
                resources=[arn for group_arn in group_arns for arn in (group_arn, f"{group_arn}:*")],
            ),
            iam.PolicyStatement(sid="NodeMetadata", actions=list(EC2_READ_ACTIONS), resources=["*"]),
        ]
    )


def configuration(cluster_name: str) -> dict[str, Any]:
    """The add-on's configuration values (JSON, the Helm chart's values schema)."""
    return {
        "tolerations": [gpu_toleration()],
        "agent": {
            "config": {
                "logs": {
                    "metrics_collected": {
                        "kubernetes": {
                            "cluster_name": cluster_name,
                            "enhanced_container_insights": True,
                            "accelerated_compute_metrics": True,
                        },
                        "emf": {},
                    }
                },
            }
        },
    }


class CloudWatchObservability(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        cluster_name: str,
        cluster_name_token: str,
        after: list[Construct],
    ) -> None:
        """cluster_name: the configured name (written into the agent's configuration as a plain string);
        cluster_name_token: the cluster's Ref, which orders the Pod Identity association after the cluster."""
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self,
            "AgentRole",
            assumed_by=pod_identity_principal(
                self, cluster_name=cluster_name, namespace=NAMESPACE, service_account=SERVICE_ACCOUNT
            ),
            description="CloudWatch agent of the amazon-cloudwatch-observability add-on (EKS Pod Identity)",
            inline_policies={"Agent": agent_policy(self, cluster_name)},
        )
        self.pod_identity = eks.CfnPodIdentityAssociation(
            self,
            "PodIdentity",
            cluster_name=cluster_name_token,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            role_arn=self.role.role_arn,
        )
        self.configuration = configuration(cluster_name)
        self.addon = eks.Addon(
            self,
            "Addon",
            cluster=cluster,
            addon_name=ADDON,
            addon_version=MANAGED_ADDONS[ADDON],
            configuration_values=self.configuration,
        )
        self.addon.node.add_dependency(self.pod_identity)
        for dependency in after:
            self.addon.node.add_dependency(dependency)

"""Container Insights with enhanced observability: the amazon-cloudwatch-observability EKS managed add-on.

It installs the CloudWatch agent (a DaemonSet, through its operator), Fluent Bit and the DCGM exporter,
and publishes per-node and per-pod NVIDIA GPU and EFA metrics (infra/spec/metrics.py lists the ones the
alarms read). Settings, from the CloudWatch user guide "Install the CloudWatch agent with the Amazon
CloudWatch Observability EKS add-on or the Helm chart" and the add-on's Helm chart
(aws-observability/helm-charts charts/amazon-cloudwatch-observability, values.yaml), which share their
configuration values:

- Permissions through EKS Pod Identity (add-on >= v3.1.0): a role trusted by pods.eks.amazonaws.com,
  associated with the `cloudwatch-agent` service account in `amazon-cloudwatch`, carrying the AWS managed
  CloudWatchAgentServerPolicy the guide prescribes (PutMetricData, the agent's log groups, EC2 describe
  calls for the node metadata); the association exists before the add-on, so the agent never starts
  without credentials.
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

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.spec.metrics import EMF_AGENT_NAMESPACE, EMF_AGENT_SERVICE
from infra.spec.scheduling import gpu_toleration
from infra.spec.versions import MANAGED_ADDONS

ADDON = "amazon-cloudwatch-observability"
NAMESPACE = EMF_AGENT_NAMESPACE
SERVICE_ACCOUNT = EMF_AGENT_SERVICE
AGENT_POLICY = "CloudWatchAgentServerPolicy"


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
            assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
            description="CloudWatch agent of the amazon-cloudwatch-observability add-on (EKS Pod Identity)",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(AGENT_POLICY)],
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

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
  on, and no `logs.metrics_collected.emf`: with it the agent listens for embedded-metric-format lines on port
  25888 TCP/UDP of every node's IP (the agent runs on the host network, below, where neither a NetworkPolicy nor a
  security group stops a pod reaching its own node) and writes each line to the log group the line names
  (`agent_policy`'s comment), so any pod could publish the MLPlatform/Training metrics the alarms read. Nothing
  listens for EMF on the nodes (issue 38).
- `containerLogs.fluentBit.config`: the training metrics take Fluent Bit's path instead (`training_emf_pipeline`).
  The pods print each EMF line on their container's stdout (training/emf.py); an input tails the container logs of
  the workload namespaces only, a filter keeps the EMF objects of the MLPlatform/Training namespace, and an output
  writes them to the cluster's EMF group, named by this configuration (infra/spec/metrics.py emf_log_group). The
  chart builds fluent-bit.conf from `service` and one `@INCLUDE` per key of `extraFiles`, and writes
  `customParsers` as parsers.conf (templates/linux/fluent-bit-configmap.yaml); its Linux files (application-log,
  dataplane-log, host-log) are keys of that map that this configuration leaves alone, and the add-on merges these
  values into the chart's (as `agent.config` relies on for every other `agent` value, `enabled` and the image
  among them), so they stay. The add-on takes these values: "Moving the fluent bit config to
  values.yaml to allow users to easily override it via helm and the Amazon CloudWatch Observability EKS add-on"
  (aws-observability/helm-charts PR #43, https://github.com/aws-observability/helm-charts/pull/43). The chart's
  application input reads every container, these too: their EMF lines also land in .../application, each inside
  Fluent Bit's record (`log`, and the decoded line under `log_processed`: its kubernetes filter has Merge_Log_Key
  log_processed, which plugins/filter_kubernetes/kubernetes.c applies to a pod's annotated parser as well), whose
  root holds no `_aws`, so CloudWatch extracts no metric there: a copy for reading, not a second publication.
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

import re
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.cluster import control_plane_log_group_name, log_group_arns
from infra.spec.metrics import NAMESPACE as TRAINING_METRICS_NAMESPACE
from infra.spec.metrics import agent_log_groups, emf_container_log_paths, emf_log_group
from infra.spec.scheduling import gpu_toleration
from infra.spec.versions import MANAGED_ADDONS
from infra.trust import pod_identity_principal

ADDON = "amazon-cloudwatch-observability"
# The chart's release namespace and the agent's (and Fluent Bit's) service account.
NAMESPACE = "amazon-cloudwatch"
SERVICE_ACCOUNT = "cloudwatch-agent"

# What the agent role may do, and why nothing more. Add-on v6.2.0 is aws-observability/helm-charts tag
# amazon-cloudwatch-observability-6.2.0 (agent image 1.300069.0b1529, aws-for-fluent-bit 3.4.0); agent paths below are
# aws/amazon-cloudwatch-agent at tag v1.300069.0, whose go.mod replaces the OTel exporters with the fork
# amazon-contributing/opentelemetry-collector-contrib.
#
# Log groups (infra/spec/metrics.py agent_log_groups): the agent writes Container Insights' EMF to
# /aws/containerinsights/<cluster>/performance; Fluent Bit, which runs as the same service account
# (templates/linux/fluent-bit-daemonset.yaml), writes .../application, .../dataplane and .../host and, through
# `training_emf_pipeline`, the training metrics' group .../training-emf. The agent no longer listens for EMF: its
# emf_logs exporter took the destination from the line (with raw_log it reads `_aws.LogGroupName` /
# `_aws.LogStreamName`, or `log_group_name` / `log_stream_name`, and uses its fixed fallback "emf/logs/default" only
# when the line names none: translator/translate/otel/exporter/awscloudwatchlogs/translator.go setEmfFields, and
# exporter/awscloudwatchlogsexporter/exporter.go logToCWLog in the fork, read at 3a9a8a0b), with no setting to fix it.
# Fluent Bit's cloudwatch_logs output writes to its configured log_group_name and reads a group from the record only
# when a log_group_template is set (fluent-bit plugins/out_cloudwatch_logs/cloudwatch_logs.c), and none is. This
# policy still bounds every writer: the role writes these five groups only, so a misconfiguration cannot reach any
# other (the control-plane group /aws/eks/<cluster>/cluster among them). The one wildcard left is `:*`, the log
# streams inside each of its own groups.
#
# Log actions: CreateLogStream, CreateLogGroup when that fails with ResourceNotFound, PutLogEvents (the fork's
# internal/aws/cwlogs/cwlog_client.go CreateStream and PutLogEvents; fluent-bit plugins/out_cloudwatch_logs
# cloudwatch_api.c the same three). PutRetentionPolicy is called only for a configured retention and none is (no
# log_retention in the agent's translated exporters, no log_retention_days in the chart's Fluent Bit outputs);
# neither calls DescribeLogStreams or DescribeLogGroups.
#
# Metrics: no cloudwatch:PutMetricData. The agent's translated configuration exports through awsemf/containerinsights
# (PutLogEvents; translator/tocwconfig/sampleConfig/emf_and_kubernetes_with_gpu_config.yaml, less its emf_logs
# exporter, which only the emf section adds), Fluent Bit through cloudwatch_logs (PutLogEvents); CloudWatch extracts
# the ContainerInsights and MLPlatform/Training metrics from those log events. A PutMetricData grant, even one
# narrowed by a cloudwatch:namespace condition (its only narrowing: the action has no resource-level permissions,
# Service Authorization Reference "Actions, resources, and condition keys for Amazon CloudWatch"; CloudWatch user
# guide iam-cw-condition-keys-namespace.html), would be a permission nothing uses.
#
# EC2: DescribeTags (Auto Scaling group and cluster tags of the node) and DescribeVolumes (EBS volume ids of its
# devices), the fork's receiver/awscontainerinsightreceiver/internal/host/ec2tags.go and ebsvolume.go; neither has
# resource-level permissions (Service Authorization Reference, Amazon EC2), so Resource is "*". The managed policy's
# xray:* (traces) and ssm:GetParameter on AmazonCloudWatch-* (an SSM-stored agent configuration) serve nothing here.
LOG_WRITE_ACTIONS = ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents")
EC2_READ_ACTIONS = ("ec2:DescribeTags", "ec2:DescribeVolumes")


def agent_policy(scope: Construct, cluster_name: str) -> iam.PolicyDocument:
    """The agent role's only policy: log writes on its own groups (and their streams), EC2 describes for metadata."""
    assert control_plane_log_group_name(cluster_name) not in agent_log_groups(cluster_name)
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid="OwnLogGroups",
                actions=list(LOG_WRITE_ACTIONS),
                # The group itself (CreateLogGroup, CreateLogStream) and its streams (PutLogEvents).
                resources=[arn for group in agent_log_groups(cluster_name) for arn in log_group_arns(scope, group)],
            ),
            iam.PolicyStatement(sid="NodeMetadata", actions=list(EC2_READ_ACTIONS), resources=["*"]),
        ]
    )


# --- Fluent Bit: the training metrics' path ------------------------------------------------------------------------
# Fluent Bit is the chart's aws-for-fluent-bit 3.4.0 (values.yaml containerLogs.fluentBit.image), Fluent Bit 5.0
# (aws/aws-for-fluent-bit releases 3.4.x); plugin behaviour below read in fluent/fluent-bit at v5.0.5.

TRAINING_EMF_FILE = "training-emf.conf"
EMF_TAG = "training-emf.*"
EMF_JSON_PARSER = "training_emf_json"
EMF_LUA_FUNCTION = "training_emf_only"

# The chart's customParsers at 6.2.0 (values.yaml containerLogs.fluentBit.config.customParsers), kept as written:
# customParsers is one string, so setting it replaces the chart's, and ours is added after them. The classic format
# allows [PARSER] sections only in the parsers file, not in an included file (src/flb_config.c: "Sections
# 'multiline_parser' and 'parser' are not valid in the main configuration file").
CHART_CUSTOM_PARSERS = (
    "[PARSER]\n"
    "  Name                syslog\n"
    "  Format              regex\n"
    "  Regex               ^(?<time>[^ ]* {1,2}[^ ]* [^ ]*) (?<host>[^ ]*) "
    "(?<ident>[a-zA-Z0-9_\\/\\.\\-]*)(?:\\[(?<pid>[0-9]+)\\])?(?:[^\\:]*\\:)? *(?<message>.*)$\n"
    "  Time_Key            time\n"
    "  Time_Format         %b %d %H:%M:%S\n"
    "\n"
    "[PARSER]\n"
    "  Name                container_firstline\n"
    "  Format              regex\n"
    '  Regex               (?<log>(?<="log":")\\S(?!\\.).*?)(?<!\\\\)".*(?<stream>(?<="stream":").*?)".*'
    "(?<time>\\d{4}-\\d{1,2}-\\d{1,2}T\\d{2}:\\d{2}:\\d{2}\\.\\w*).*(?=})\n"
    "  Time_Key            time\n"
    "  Time_Format         %Y-%m-%dT%H:%M:%S.%LZ\n"
    "\n"
    "[PARSER]\n"
    "  Name                cwagent_firstline\n"
    "  Format              regex\n"
    '  Regex               (?<log>(?<="log":")\\d{4}[\\/-]\\d{1,2}[\\/-]\\d{1,2}[ T]\\d{2}:\\d{2}:\\d{2}(?!\\.).*?)'
    '(?<!\\\\)".*(?<stream>(?<="stream":").*?)".*(?<time>\\d{4}-\\d{1,2}-\\d{1,2}T\\d{2}:\\d{2}:\\d{2}\\.\\w*).*'
    "(?=})\n"
    "  Time_Key            time\n"
    "  Time_Format         %Y-%m-%dT%H:%M:%S.%LZ\n"
)
# A JSON parser with no time key: the record keeps the container log line's time (plugins/filter_parser/filter_parser.c
# takes a parsed time only when the parser yields one).
CUSTOM_PARSERS = (
    f"{CHART_CUSTOM_PARSERS}\n[PARSER]\n  Name                {EMF_JSON_PARSER}\n  Format              json\n"
)

# The filter's whole decision, on the record the JSON parser made of a line (Fluent Bit hands it over as a Lua table,
# a JSON object or array becoming a table, null becoming nil: src/flb_lua.c flb_lua_pushmpack). It drops (-1) what is
# not an EMF object whose every directive names the training namespace: a line the parser could not decode (the
# record still holds `log`), JSON without `_aws`, directives that are not a list of objects, or one of them naming
# another namespace (ContainerInsights, whose node_gpu_utilization and EFA metrics the fabric alarms read, among
# them) or none. It returns 2 for the rest (the record was modified, keep its time: plugins/filter_lua/lua.c), so
# Fluent Bit writes the table it checked: a key the line repeated is one key in the table (the last, as lua_settable
# assigns them in order), so what CloudWatch reads is what was checked. It also removes the destination fields a line
# may carry; the output ignores them (no log_group_template) and so does CloudWatch Logs, but the event keeps no sign
# of a destination other than the configured one. One line of Lua, no comments, no length operator: the classic
# format reads a property from one line and skips a line that starts with `#`.
EMF_LUA = f"""
function {EMF_LUA_FUNCTION}(tag, timestamp, record)
  local aws = record["_aws"]
  if type(aws) ~= "table" then return -1, timestamp, record end
  local directives = aws["CloudWatchMetrics"]
  if type(directives) ~= "table" then return -1, timestamp, record end
  local count, last = 0, 0
  for index, directive in pairs(directives) do
    if type(index) ~= "number" or type(directive) ~= "table" then return -1, timestamp, record end
    if directive["Namespace"] ~= "{TRAINING_METRICS_NAMESPACE}" then return -1, timestamp, record end
    count = count + 1
    if index > last then last = index end
  end
  if count == 0 or count ~= last then return -1, timestamp, record end
  aws["LogGroupName"] = nil
  aws["LogStreamName"] = nil
  record["log_group_name"] = nil
  record["log_stream_name"] = nil
  return 2, timestamp, record
end
"""


def _section(name: str, properties: list[tuple[str, str]]) -> str:
    return "\n".join([f"[{name}]", *(f"  {key:<19} {value}" for key, value in properties)]) + "\n"


def training_emf_pipeline(cluster_name: str) -> str:
    """Fluent Bit's training-metrics pipeline (classic format), included beside the chart's files.

    tail: the container logs of the workload namespaces only (infra/spec/metrics.py emf_container_log_paths), with
    the chart's own settings for container logs (application-log.conf) and a state file of its own. parser: the `log`
    field (the line the container printed) decoded as JSON replaces the record; a line that is not JSON stays as it
    was. lua: EMF_LUA. cloudwatch_logs: the whole record as the event, into the cluster's EMF group, with
    `log_format json/emf` (the x-amzn-logs-format header; CloudWatch user guide "Using the PutLogEvents API to send
    manually-created embedded metric format logs"), and neither `log_group_template` nor `log_key`
    (plugins/out_cloudwatch_logs/cloudwatch_logs.c)."""
    assert re.fullmatch(r"[A-Za-z0-9/_.-]+", TRAINING_METRICS_NAMESPACE), "a plain Lua string literal"
    code = " ".join(line.strip() for line in EMF_LUA.strip().splitlines())
    return "\n".join(
        [
            _section(
                "INPUT",
                [
                    ("Name", "tail"),
                    ("Tag", EMF_TAG),
                    ("Path", ", ".join(emf_container_log_paths())),
                    ("multiline.parser", "docker, cri"),
                    ("DB", "/var/fluent-bit/state/flb_training_emf.db"),
                    ("Mem_Buf_Limit", "5MB"),
                    ("Skip_Long_Lines", "On"),
                    ("Refresh_Interval", "10"),
                    ("Rotate_Wait", "30"),
                    ("storage.type", "filesystem"),
                    ("Read_from_Head", "${READ_FROM_HEAD}"),
                ],
            ),
            _section(
                "FILTER", [("Name", "parser"), ("Match", EMF_TAG), ("Key_Name", "log"), ("Parser", EMF_JSON_PARSER)]
            ),
            _section("FILTER", [("Name", "lua"), ("Match", EMF_TAG), ("call", EMF_LUA_FUNCTION), ("code", code)]),
            _section(
                "OUTPUT",
                [
                    ("Name", "cloudwatch_logs"),
                    ("Match", EMF_TAG),
                    ("region", "${AWS_REGION}"),
                    ("log_group_name", emf_log_group(cluster_name)),
                    ("log_stream_prefix", "${HOST_NAME}-"),
                    ("log_format", "json/emf"),
                    ("auto_create_group", "true"),
                ],
            ),
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
                    }
                },
            }
        },
        "containerLogs": {
            "fluentBit": {
                "config": {
                    "customParsers": CUSTOM_PARSERS,
                    "extraFiles": {TRAINING_EMF_FILE: training_emf_pipeline(cluster_name)},
                }
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

"""Alarms for a too-slow success, their SNS topic and the environment's dashboard.

Which stack holds what (infra/stage.py):
- Platform: the KMS-encrypted SNS topic (with the optional e-mail subscription) and the dashboard of the
  environment, which shows every GPU group; both live as long as the cluster.
- Gpu-<group>: that group's alarms, built from infra/spec/alarms.py (the same rules the pure evaluator
  checks against recorded series). They are created and removed with the group: a group whose stack
  rolled back after a capacity failure leaves no alarm on metrics that cannot exist, and adding a group
  never touches Platform's alarms. The topic crosses stacks as a construct attribute (an export of Platform).

Why Metrics Insights queries, a composite alarm and no Lambda: see infra/spec/alarms.py.
CloudWatch alarm actions publishing to a KMS-encrypted topic need the key to let cloudwatch.amazonaws.com
use it (kms:Decrypt, kms:GenerateDataKey*; Amazon SNS developer guide, "Enabling compatibility between
event sources from AWS services and encrypted topics"); the key policy below grants exactly that.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from infra.spec import Environment, GpuNodeGroupConfig, throughput_baselines
from infra.spec.alarms import AlarmRule, GroupAlarms, group_alarm_rules


def rules_for(environment: Environment, group: GpuNodeGroupConfig) -> GroupAlarms:
    """The group's alarm rules, with a throughput alarm per measured baseline (infra/spec/throughput_baselines.py);
    a record that no longer fits the group (its instance type or node count changed) stops the synth."""
    measured = throughput_baselines.for_group(
        throughput_baselines.load(),
        environment=environment.name,
        group=group.name,
        instance_type=group.instance_type,
        node_count=group.workload_nodes,
    )
    return group_alarm_rules(
        cluster=environment.cluster.name, group=group.name, instance_type=group.instance_type, baselines=measured
    )


KEY_GRANT_SID = "CloudWatchAlarmsPublish"


def alarm_arn_pattern(scope: Construct, environment: Environment) -> str:
    """The ARNs of the environment's alarms: this account and region, named after the cluster (GpuGroupAlarms)."""
    stack = Stack.of(scope)
    return f"arn:{stack.partition}:cloudwatch:{stack.region}:{stack.account}:alarm:{environment.cluster.name}-*"


class AlarmTopic(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description=f"Encrypts the alarm topic of environment {environment.name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # No aws:SourceAccount/aws:SourceArn here, unlike the topic's grant below: the Amazon SNS guide's key policy
        # for event sources ("Enable compatibility between event sources from AWS services and encrypted topics",
        # sns-key-management.html#compatibility-with-aws-services) has none, and no AWS page documents those keys in
        # the KMS request SNS makes for a CloudWatch publish; a condition that request lacks would drop every alarm
        # notification unseen. The key encrypts this topic alone, and CloudWatch reaches it only through a Publish
        # the topic policy admits (this account's alarms of this environment). gates/templates.py acknowledges this
        # statement by its Sid (SERVICE_GRANT_ACKNOWLEDGED).
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid=KEY_GRANT_SID,
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            display_name=f"ML platform alarms ({environment.name})",
            master_key=self.key,
            enforce_ssl=True,
        )
        # Confused deputy (IAM User Guide, "The confused deputy problem"): CloudWatch publishes as the alarm, with
        # aws:SourceArn the alarm's ARN (arn:...:cloudwatch:REGION:ACCOUNT:alarm:NAME) and aws:SourceAccount its
        # account (Amazon SNS Developer Guide, "Example cases for Amazon SNS access control"; AWS re:Post knowledge
        # center "cloudwatch-receive-sns-for-alarm-trigger"). Every alarm of the environment is named
        # <cluster>-... (GpuGroupAlarms below): no alarm of another account or environment publishes here.
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": Stack.of(self).account},
                    "ArnLike": {"aws:SourceArn": alarm_arn_pattern(self, environment)},
                },
            )
        )
        email = environment.add_ons.alarm_email
        self.subscription = (
            self.topic.add_subscription(subscriptions.EmailSubscription(email)) if email is not None else None
        )


def _query_alarm(scope: Construct, rule: AlarmRule, *, name: str, actions: list[str]) -> cw.CfnAlarm:
    common: dict[str, Any] = {
        "alarm_name": name,
        "alarm_description": rule.description,
        "comparison_operator": rule.comparison.value,
        "threshold": rule.threshold,
        "evaluation_periods": rule.evaluation_periods,
        "datapoints_to_alarm": rule.datapoints_to_alarm,
        "treat_missing_data": rule.missing.value,
        "actions_enabled": bool(actions),
        "alarm_actions": actions or None,
        "ok_actions": actions or None,
    }
    if rule.query is not None:
        common["metrics"] = [
            cw.CfnAlarm.MetricDataQueryProperty(id="q", expression=rule.query, period=rule.period_s, return_data=True)
        ]
    else:
        assert rule.dimensions is not None
        assert rule.statistic is not None
        common |= {
            "namespace": rule.metric.namespace,
            "metric_name": rule.metric.name,
            "dimensions": [cw.CfnAlarm.DimensionProperty(name=k, value=v) for k, v in rule.dimensions.items()],
            "statistic": rule.statistic,
            "period": rule.period_s,
        }
    return cw.CfnAlarm(scope, rule.name, **common)


class GpuGroupAlarms(Construct):
    """One GPU group's alarms: fabric idle while GPUs are busy (composite), throughput under baseline
    (per job), restarts per hour, a failed fabric gate (training/fabric_gate.py's EMF metric)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        group: GpuNodeGroupConfig,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rules = rules_for(environment, group)
        prefix = environment.cluster.name
        actions = [topic.topic_arn]
        self.children = {
            rule.name: _query_alarm(self, rule, name=f"{prefix}-{rule.name}", actions=[])
            for rule in self.rules.fabric_children
        }
        self.fabric_idle = cw.CfnCompositeAlarm(
            self,
            "FabricIdle",
            alarm_name=f"{prefix}-{group.name}-fabric-idle-gpus-busy",
            alarm_description=(
                f"GPUs of group {group.name} busy while every EFA interface is idle for "
                f"{self.rules.gpu_busy.evaluation_periods} minutes: a job on TCP or a stalled collective. "
                "Check the job's NCCL lines (trainctl logs, the fabric analyzer) and its throughput alarm."
            ),
            alarm_rule=" AND ".join(f'ALARM("{alarm.alarm_name}")' for alarm in self.children.values()),
            actions_enabled=True,
            alarm_actions=actions,
            ok_actions=actions,
        )
        for child in self.children.values():
            self.fabric_idle.node.add_dependency(child)
        self.throughput = {
            baseline.key: _query_alarm(self, rule, name=f"{prefix}-{rule.name}", actions=actions)
            for baseline, rule in self.rules.throughput
        }
        self.restarts = _query_alarm(
            self, self.rules.restarts, name=f"{prefix}-{self.rules.restarts.name}", actions=actions
        )
        self.fabric_gate = _query_alarm(
            self, self.rules.fabric_gate, name=f"{prefix}-{self.rules.fabric_gate.name}", actions=actions
        )


def _widget(
    title: str, rules: list[AlarmRule], region: str, *, y: int, x: int, annotations: list[dict[str, Any]]
) -> dict[str, Any]:
    metrics: list[Any] = []
    for index, rule in enumerate(rules):
        if rule.query is not None:
            metrics.append([{"expression": rule.query, "id": f"q{index}", "label": rule.metric.name, "period": 60}])
        else:
            assert rule.dimensions is not None
            dims = [item for kv in rule.dimensions.items() for item in kv]
            metrics.append(
                [rule.metric.namespace, rule.metric.name, *dims, {"stat": rule.statistic, "period": rule.period_s}]
            )
    return {
        "type": "metric",
        "x": x,
        "y": y,
        "width": 6,
        "height": 6,
        "properties": {
            "title": title,
            "region": region,
            "view": "timeSeries",
            "metrics": metrics,
            "annotations": {"horizontal": annotations},
        },
    }


def _waiting_widget(environment: Environment, group: GpuNodeGroupConfig, *, y: int, x: int) -> dict[str, Any]:
    """A group without a measured baseline has no throughput alarm: its row says so, and how to end the wait."""
    title = f"{group.name} ({group.instance_type}): waiting for its first measured run"
    text = (
        "No throughput alarm for this group yet: its threshold comes from a measured run only. After the first "
        f"fabric-gated run of a job on {group.workload_nodes} x {group.instance_type}: `trainctl baseline record "
        f"--env {environment.name} --group {group.name} --job JOB REPORT` (REPORT: the job's journal.jsonl or the "
        "Ray fine-tune's --output-json), then deploy."
    )
    return {
        "type": "text",
        "x": x,
        "y": y,
        "width": 6,
        "height": 6,
        "properties": {"markdown": f"### {title}\n\n{text}"},
    }


def dashboard_body(environment: Environment) -> dict[str, Any]:
    widgets: list[dict[str, Any]] = []
    region = environment.region
    throughput_baselines.check_groups_exist(
        throughput_baselines.load(), environment=environment.name, groups=[g.name for g in environment.gpu_node_groups]
    )
    for row, group in enumerate(environment.gpu_node_groups):
        rules = rules_for(environment, group)
        y = row * 6
        name = f"{group.name} ({group.instance_type})"
        widgets.append(
            _widget(
                f"{name}: GPU utilisation (max)",
                [rules.gpu_busy],
                region,
                y=y,
                x=0,
                annotations=[{"label": "busy", "value": rules.gpu_busy.threshold}],
            )
        )
        widgets.append(
            _widget(
                f"{name}: EFA bytes/s (max per interface)",
                [rules.efa_rx_idle, rules.efa_tx_idle],
                region,
                y=y,
                x=6,
                annotations=[{"label": "idle floor", "value": rules.efa_rx_idle.threshold}],
            )
        )
        throughput = [rule for _, rule in rules.throughput]
        if throughput:
            widgets.append(
                _widget(
                    f"{name}: tokens/s vs measured baseline",
                    throughput,
                    region,
                    y=y,
                    x=12,
                    annotations=[
                        annotation
                        for baseline, rule in rules.throughput
                        for annotation in (
                            {"label": f"{baseline.job} baseline", "value": baseline.tokens_per_s},
                            {"label": f"{baseline.job} alarm", "value": rule.threshold},
                        )
                    ],
                )
            )
        else:
            # A metric widget without metrics renders empty; say why there is no throughput alarm instead.
            widgets.append(_waiting_widget(environment, group, y=y, x=12))
        widgets.append(
            _widget(
                f"{name}: restarts per hour",
                [rules.restarts],
                region,
                y=y,
                x=18,
                annotations=[{"label": "alarm", "value": rules.restarts.threshold}],
            )
        )
    return {"widgets": widgets}


class EnvironmentDashboard(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment) -> None:
        super().__init__(scope, construct_id)
        self.body = dashboard_body(environment)
        self.dashboard = cw.CfnDashboard(
            self,
            "Dashboard",
            dashboard_name=f"{environment.cluster.name}-training",
            dashboard_body=json.dumps(self.body, sort_keys=True),
        )

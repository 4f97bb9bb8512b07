"""Issue 15: the CloudWatch observability add-on, the alarms of each GPU group, the topic and the dashboard
(from the synthesized templates), and the alarm logic evaluated on recorded metric series."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from infra.addons.observability import ADDON, NAMESPACE, SERVICE_ACCOUNT, CloudWatchObservability, configuration
from infra.cluster import control_plane_log_group_name
from infra.spec import ENVIRONMENTS, AddOnsConfig, ConfigError, throughput_baselines
from infra.spec.alarms import (
    Comparison,
    Missing,
    State,
    evaluate,
    fabric_idle_state,
    final_state,
    group_alarm_rules,
    throughput_rule,
)
from infra.spec.metrics import CONTAINER_INSIGHTS, emf_log_group
from infra.spec.operating import OPERATING
from infra.spec.scheduling import GPU_TAINT_KEY
from infra.spec.versions import MANAGED_ADDONS
from tests.conftest import cdk_json_context
from tests.helpers import of_type
from training.emf import NAMESPACE as TRAINING_NAMESPACE
from training.fabric_verdict import release_command

SERIES = Path(__file__).parent / "fixtures" / "metric_series"


def _only(items: list[Any]) -> Any:
    assert len(items) == 1, items
    return items[0]


def test_addon_is_pinned_with_pod_identity_gpu_toleration_and_no_emf_listener(
    stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str
) -> None:
    platform = stack_templates[env_name]["Platform"]
    addon = _only([a for a in of_type(platform, "AWS::EKS::Addon").values() if a["Properties"]["AddonName"] == ADDON])
    assert addon["Properties"]["AddonVersion"] == MANAGED_ADDONS[ADDON]
    config = json.loads(addon["Properties"]["ConfigurationValues"])  # a plain JSON string, no tokens
    assert config["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]["cluster_name"] == (
        ENVIRONMENTS[env_name].cluster.name
    )
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in config["tolerations"]
    collected = config["agent"]["config"]["logs"]["metrics_collected"]
    assert collected["kubernetes"]["enhanced_container_insights"] is True
    assert collected["kubernetes"]["accelerated_compute_metrics"] is True
    assert "emf" not in collected, "no EMF listener on the nodes (issue 38): Fluent Bit ships the training metrics"
    # The whole configuration, Fluent Bit's training-metrics pipeline with it (test_training_emf_pipeline.py).
    assert config == configuration(ENVIRONMENTS[env_name].cluster.name)
    # The agent keeps the chart's hostNetwork: true, its way to IMDS at the nodes' hop limit of 1.
    assert "hostNetwork" not in config["agent"]
    association = _only(list(of_type(platform, "AWS::EKS::PodIdentityAssociation").values()))
    assert (association["Properties"]["Namespace"], association["Properties"]["ServiceAccount"]) == (
        NAMESPACE,
        SERVICE_ACCOUNT,
    )
    role_id = association["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    role = platform["Resources"][role_id]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert "ManagedPolicyArns" not in role, "the agent's own policy only (test_agent_role_* below)"
    addon_id = next(k for k, v in of_type(platform, "AWS::EKS::Addon").items() if v is addon)
    assert any("PodIdentity" in d for d in platform["Resources"][addon_id].get("DependsOn", []))


# --- the agent role's policy: the construct synthesized alone (account and region concrete: ARNs are plain strings) --

ACCOUNT = "111111111111"


@pytest.fixture(scope="module")
def agent_roles() -> dict[str, dict[str, Any]]:
    """Environment -> the Properties of the agent's role, CloudWatchObservability synthesized in a stack of its own
    for that environment's region and cluster name."""
    import aws_cdk as cdk
    from aws_cdk import aws_eks_v2 as eks
    from aws_cdk.assertions import Template

    app = cdk.App(context=cdk_json_context())
    stacks = {}
    for name, environment in ENVIRONMENTS.items():
        stack = cdk.Stack(app, f"Probe-{name}", env=cdk.Environment(account=ACCOUNT, region=environment.region))
        cluster_name = environment.cluster.name
        cluster = eks.Cluster.from_cluster_attributes(stack, "Cluster", cluster_name=cluster_name)
        CloudWatchObservability(
            stack,
            "CloudWatchObservability",
            cluster=cluster,
            cluster_name=cluster_name,
            cluster_name_token=cluster_name,
            after=[],
        )
        stacks[name] = stack
    roles: dict[str, dict[str, Any]] = {}
    for name, stack in stacks.items():  # every stack built before the first synth
        template = dict(Template.from_stack(stack).to_json())
        roles[name] = _only(list(of_type(template, "AWS::IAM::Role").values()))["Properties"]
        assert not of_type(template, "AWS::IAM::Policy"), "every grant is in the role's own policy"
    return roles


# What an attached AWS managed policy grants, so the checks below see it: CloudWatchAgentServerPolicy's document (AWS
# Managed Policy Reference, CloudWatchAgentServerPolicy); any other managed policy counts as everything on everything.
MANAGED_STATEMENTS: dict[str, list[dict[str, Any]]] = {
    "CloudWatchAgentServerPolicy": [
        {
            "Effect": "Allow",
            "Action": [
                "cloudwatch:PutMetricData",
                "ec2:DescribeVolumes",
                "ec2:DescribeTags",
                "logs:PutLogEvents",
                "logs:PutRetentionPolicy",
                "logs:DescribeLogStreams",
                "logs:DescribeLogGroups",
                "logs:CreateLogStream",
                "logs:CreateLogGroup",
                "xray:PutTraceSegments",
                "xray:PutTelemetryRecords",
                "xray:GetSamplingRules",
                "xray:GetSamplingTargets",
                "xray:GetSamplingStatisticSummaries",
            ],
            "Resource": "*",
        },
        {"Effect": "Allow", "Action": ["ssm:GetParameter"], "Resource": "arn:aws:ssm:*:*:parameter/AmazonCloudWatch-*"},
    ]
}


def _statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    inline = [s for policy in role.get("Policies", []) for s in policy["PolicyDocument"]["Statement"]]
    managed = [
        s
        for arn in role.get("ManagedPolicyArns", [])
        for s in MANAGED_STATEMENTS.get(
            json.dumps(arn).rsplit("policy/", 1)[-1].split('"')[0],
            [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        )
    ]
    return inline + managed


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _iam_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's wildcard match (`*` any run of characters, `?` one); action names are case-insensitive, ARNs are not."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.IGNORECASE if ignore_case else 0) is not None


def _grants(statement: dict[str, Any], action: str) -> bool:
    return statement["Effect"] == "Allow" and any(
        _iam_match(a, action, ignore_case=True) for a in _listed(statement["Action"])
    )


def _allows(role: dict[str, Any], action: str, resource: str) -> bool:
    return any(
        _grants(s, action) and "Condition" not in s and any(_iam_match(r, resource) for r in _listed(s["Resource"]))
        for s in _statements(role)
    )


def _log_group_arn(env_name: str, group: str) -> str:
    return f"arn:aws:logs:{ENVIRONMENTS[env_name].region}:{ACCOUNT}:log-group:{group}"


def _own_groups(env_name: str) -> set[str]:
    cluster = ENVIRONMENTS[env_name].cluster.name
    return {f"/aws/containerinsights/{cluster}/{k}" for k in ("performance", "application", "dataplane", "host")} | {
        emf_log_group(cluster)
    }


WRITES = ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:PutRetentionPolicy")


def test_agent_role_has_no_managed_policy(agent_roles: dict[str, dict[str, Any]], env_name: str) -> None:
    """CloudWatchAgentServerPolicy grants log writes and retention on every group and PutMetricData anywhere."""
    role = agent_roles[env_name]
    assert role.get("ManagedPolicyArns", []) == []
    assert "CloudWatchAgentServerPolicy" not in json.dumps(role)


def test_agent_role_writes_no_log_group_but_its_own(agent_roles: dict[str, dict[str, Any]], env_name: str) -> None:
    """The role bounds every writer of the add-on: whatever a configuration or a line says, it writes its own groups
    and not the control-plane (audit) group or any other."""
    role = agent_roles[env_name]
    for statement in _statements(role):
        if any(a.startswith("logs:") or a == "*" for a in _listed(statement["Action"])):
            assert "*" not in _listed(statement["Resource"]), statement
    control_plane = _log_group_arn(env_name, control_plane_log_group_name(ENVIRONMENTS[env_name].cluster.name))
    foreign = (
        control_plane,
        f"{control_plane}:log-stream:kube-apiserver-audit-0123",
        _log_group_arn(env_name, "/aws/containerinsights/other-cluster/performance"),
        _log_group_arn(env_name, "/aws/lambda/anything"),
        _log_group_arn(env_name, "emf/logs/default"),
        _log_group_arn(env_name, "/aws/containerinsights/other-cluster/training-emf"),
    )
    for action in WRITES:
        for arn in foreign:
            assert not _allows(role, action, arn), f"{action} on {arn}"
    for group in _own_groups(env_name):
        arn = _log_group_arn(env_name, group)
        assert _allows(role, "logs:CreateLogGroup", arn), group
        assert _allows(role, "logs:CreateLogStream", arn), group
        assert _allows(role, "logs:PutLogEvents", f"{arn}:log-stream:ip-10-0-0-1.ec2.internal"), group
    emf_group = _log_group_arn(env_name, emf_log_group(ENVIRONMENTS[env_name].cluster.name))
    assert not _allows(role, "logs:PutRetentionPolicy", emf_group), "no caller"


def test_agent_role_log_resources_are_exactly_its_groups_and_their_streams(
    agent_roles: dict[str, dict[str, Any]], env_name: str
) -> None:
    role = agent_roles[env_name]
    resources = {
        r
        for s in _statements(role)
        if any(a.startswith("logs:") for a in _listed(s["Action"]))
        for r in _listed(s["Resource"])
    }
    expected = {
        arn for g in _own_groups(env_name) for arn in (_log_group_arn(env_name, g), f"{_log_group_arn(env_name, g)}:*")
    }
    assert resources == expected


def test_agent_role_puts_metric_data_only_to_its_namespaces(
    agent_roles: dict[str, dict[str, Any]], env_name: str
) -> None:
    """PutMetricData has no resource-level permissions: only a cloudwatch:namespace condition narrows it. The agent's
    configuration makes no PutMetricData call (its metrics are EMF log events), so the role has none; one added later
    must name the agent's namespaces and nothing else."""
    role = agent_roles[env_name]
    granting = [s for s in _statements(role) if _grants(s, "cloudwatch:PutMetricData")]
    for statement in granting:
        namespaces = statement.get("Condition", {}).get("StringEquals", {}).get("cloudwatch:namespace")
        assert namespaces is not None, f"PutMetricData without a namespace condition: {statement}"
        assert set(_listed(namespaces)) <= {CONTAINER_INSIGHTS, TRAINING_NAMESPACE}, statement
    assert granting == []


def test_agent_role_reads_only_the_ec2_metadata_it_uses(agent_roles: dict[str, dict[str, Any]], env_name: str) -> None:
    role = agent_roles[env_name]
    actions = {a for s in _statements(role) for a in _listed(s["Action"])}
    assert {a for a in actions if not a.startswith("logs:")} == {"ec2:DescribeTags", "ec2:DescribeVolumes"}
    assert not any("*" in a for a in actions), actions


def test_topic_is_kms_encrypted_and_cloudwatch_may_use_the_key(
    stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str
) -> None:
    platform = stack_templates[env_name]["Platform"]
    topic = _only(list(of_type(platform, "AWS::SNS::Topic").values()))
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = platform["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    grants = [s for s in key["KeyPolicy"]["Statement"] if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(_only(grants)["Action"])
    assert not of_type(platform, "AWS::SNS::Subscription"), "no alarm_email: no subscription"


def test_each_gpu_group_has_its_alarms_in_its_own_stack(
    stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str
) -> None:
    environment = ENVIRONMENTS[env_name]
    for group in environment.gpu_node_groups:
        template = stack_templates[env_name][f"Gpu-{group.name}"]
        rules = group_alarm_rules(cluster=environment.cluster.name, group=group.name, instance_type=group.instance_type)
        alarms = {
            a["Properties"]["AlarmName"]: a["Properties"] for a in of_type(template, "AWS::CloudWatch::Alarm").values()
        }
        floor = OPERATING[group.instance_type].efa_idle_floor_bytes_per_s
        for rule in rules.fabric_children:
            props = alarms[f"{environment.cluster.name}-{rule.name}"]
            (query,) = props["Metrics"]
            assert query["Expression"] == rule.query
            assert f"InstanceType = '{group.instance_type}'" in query["Expression"]
            assert f"ClusterName = '{environment.cluster.name}'" in query["Expression"]
            assert (props["EvaluationPeriods"], props["DatapointsToAlarm"]) == (10, 9)
            assert "AlarmActions" not in props, "children only feed the composite"
        rx = alarms[f"{environment.cluster.name}-{rules.efa_rx_idle.name}"]
        assert rx["Threshold"] == pytest.approx(floor)
        assert (rx["ComparisonOperator"], rx["TreatMissingData"]) == ("LessThanThreshold", "breaching")
        composite = _only(list(of_type(template, "AWS::CloudWatch::CompositeAlarm").values()))["Properties"]
        for rule in rules.fabric_children:
            assert f'ALARM("{environment.cluster.name}-{rule.name}")' in composite["AlarmRule"]
        assert composite["AlarmRule"].count(" AND ") == 2
        assert len(composite["AlarmActions"]) == 1
        restarts = alarms[f"{environment.cluster.name}-{group.name}-restarts"]
        assert (restarts["Namespace"], restarts["MetricName"], restarts["Period"]) == (
            "MLPlatform/Training",
            "Restarts",
            3600,
        )
        throughput = [p for name, p in alarms.items() if "-throughput-" in name]
        expected = [b for b in throughput_baselines.load() if (b.environment, b.group) == (env_name, group.name)]
        assert len(throughput) == len(expected)
        for props, baseline in zip(throughput, expected, strict=True):
            assert props["Threshold"] == pytest.approx(0.8 * baseline.tokens_per_s)
            assert f"JobName = '{baseline.job}'" in props["Metrics"][0]["Expression"]


def test_dashboard_shows_every_gpu_group(stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str) -> None:
    platform = stack_templates[env_name]["Platform"]
    body = json.loads(
        _only(list(of_type(platform, "AWS::CloudWatch::Dashboard").values()))["Properties"]["DashboardBody"]
    )
    titles = [w["properties"].get("title") or w["properties"]["markdown"] for w in body["widgets"]]
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        measured = any((b.environment, b.group) == (env_name, group.name) for b in throughput_baselines.load())
        throughput = "tokens/s vs measured baseline" if measured else "waiting for its first measured run"
        for part in ("GPU utilisation", "EFA bytes/s", throughput, "restarts per hour"):
            assert f"{group.name} ({group.instance_type}): {part}" in "\n".join(titles)


def test_bad_alarm_email_and_shared_instance_types_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"add_ons\.alarm_email"):
        AddOnsConfig(alarm_email="not-an-address")
    with pytest.raises(ConfigError, match=r"add_ons\.alarm_email"):
        AddOnsConfig(observability=False, alarm_email="oncall@example.com")


def test_groups_sharing_an_instance_type_each_get_alarms() -> None:
    # An ODCR group beside a Capacity Block group of the same type: the metrics carry only InstanceType,
    # so both groups' alarms watch the nodes of both (infra/spec/metrics.py).
    a = group_alarm_rules(cluster="ml-prod", group="odcr", instance_type="p5.48xlarge")
    b = group_alarm_rules(cluster="ml-prod", group="block", instance_type="p5.48xlarge")
    assert a.gpu_busy.query == b.gpu_busy.query
    assert a.gpu_busy.name != b.gpu_busy.name


# --- the alarm logic on recorded series -------------------------------------------------------------------------


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SERIES / f"{name}.json").read_text())
    return doc


@pytest.mark.parametrize("name", ["healthy_efa", "tcp_fallback", "idle_node"])
def test_fabric_idle_alarm_on_recorded_series(name: str) -> None:
    doc = _load(name)
    rules = group_alarm_rules(cluster=doc["cluster"], group=doc["group"], instance_type=doc["instance_type"])
    assert fabric_idle_state(rules, doc["series"]) is State(doc["expected"])


def test_tcp_fallback_alarms_only_after_the_window() -> None:
    doc = _load("tcp_fallback")
    rules = group_alarm_rules(cluster=doc["cluster"], group=doc["group"], instance_type=doc["instance_type"])
    gpu = evaluate(rules.gpu_busy, doc["series"]["node_gpu_utilization"])
    # 9 of the last 10 minutes must breach: minutes 1-8 are not enough.
    assert gpu[:8] == [State.OK] * 8
    assert gpu[8:] == [State.ALARM] * 4


def test_throughput_drop_alarms_for_the_slow_job_only() -> None:
    doc = _load("throughput_drop")
    states = {}
    for job, series in doc["series"]["TokensPerSecond"].items():
        # Each job's alarm against its own record, as `trainctl baseline record` writes one (its first minutes).
        rule = throughput_rule(doc["group"], _measured(job, doc["instance_type"], tokens_per_s=series[0]))
        assert rule.threshold == pytest.approx(0.8 * series[0])
        states[job] = final_state(rule, series).value
    assert states == doc["expected"]


def _measured(job: str, instance_type: str, *, tokens_per_s: float) -> throughput_baselines.MeasuredBaseline:
    source = throughput_baselines.Provenance(
        report="journal.jsonl",
        run_id=None,
        run_finished="2026-12-01T10:00:00Z",
        fabric_gate="PASS",
        commit="0123abc",
        recorded_by="test",
        recorded_at="2026-12-01T11:00:00Z",
    )
    return throughput_baselines.MeasuredBaseline(
        environment="dev",
        group="g6",
        job=job,
        tokens_per_s=tokens_per_s,
        steps=throughput_baselines.MIN_MEASURED_STEPS,
        model="Qwen/Qwen2.5-1.5B",
        instance_type=instance_type,
        node_count=2,
        source=source,
    )


def test_missing_data_treatments_match_cloudwatch() -> None:
    rule = group_alarm_rules(cluster="c", group="g6", instance_type="g6.12xlarge").gpu_busy
    assert (rule.comparison, rule.missing) == (Comparison.GREATER, Missing.NOT_BREACHING)
    assert evaluate(rule, [None] * 10)[-1] is State.OK
    breaching = group_alarm_rules(cluster="c", group="g6", instance_type="g6.12xlarge").efa_rx_idle
    assert evaluate(breaching, [None] * 10)[-1] is State.ALARM
    ignore = __import__("dataclasses").replace(rule, missing=Missing.IGNORE)
    assert evaluate(ignore, [99.0] * 10 + [None] * 10)[-1] is State.ALARM, "ignore keeps the last state"
    missing = __import__("dataclasses").replace(rule, missing=Missing.MISSING)
    assert evaluate(missing, [None] * 3)[-1] is State.INSUFFICIENT_DATA


def test_a_fabric_gate_failure_alarms_each_gpu_group_and_names_the_release(
    stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str
) -> None:
    """The gate's EMF line (training/fabric_gate.py emf_document: FabricGateFailed 1 on FAIL or UNKNOWN, 0 on PASS,
    dimension set InstanceType) is read by one alarm per GPU group, which notifies the topic."""
    environment = ENVIRONMENTS[env_name]
    for group in environment.gpu_node_groups:
        template = stack_templates[env_name][f"Gpu-{group.name}"]
        alarms = {
            a["Properties"]["AlarmName"]: a["Properties"] for a in of_type(template, "AWS::CloudWatch::Alarm").values()
        }
        gate = alarms[f"{environment.cluster.name}-{group.name}-fabric-gate-failed"]
        assert (gate["Namespace"], gate["MetricName"], gate["Statistic"]) == (
            "MLPlatform/Training",
            "FabricGateFailed",
            "Sum",
        )
        assert gate["Dimensions"] == [{"Name": "InstanceType", "Value": group.instance_type}]
        assert (gate["ComparisonOperator"], gate["Threshold"], gate["TreatMissingData"]) == (
            "GreaterThanThreshold",
            0,
            "notBreaching",
        )
        assert len(gate["AlarmActions"]) == 1
        # The release command trainctl status prints, from the gate's own taint key (training/fabric_gate.py).
        assert release_command("NODE") in gate["AlarmDescription"]
        assert "docs/fabric-and-alarms.md" in gate["AlarmDescription"]


def test_the_fabric_gate_alarm_fires_on_one_failure_and_clears_after_passes() -> None:
    rules = group_alarm_rules(cluster="c", group="p5", instance_type="p5.48xlarge")
    # One value per 5-minute period: Sum of FabricGateFailed (0 for each passing gate, None: no gate ran).
    assert evaluate(rules.fabric_gate, [None, 0.0, 1.0, 0.0, None]) == [
        State.OK,
        State.OK,
        State.ALARM,
        State.OK,
        State.OK,
    ]

"""The alarm topic's grants to CloudWatch carry the confused-deputy conditions (infra/monitoring.py): the topic takes
a Publish from this account's alarms of this environment only, and every alarm that publishes is one of them."""

from __future__ import annotations

import fnmatch
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Template

from infra.monitoring import AlarmTopic, GpuGroupAlarms
from infra.spec import ENVIRONMENTS
from tests.helpers import of_type, only

ENV = ENVIRONMENTS["prod"]


def _text(value: Any) -> str:
    """A template value as text, pseudo parameters as ${Name} (enough for the joins CDK writes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return "${" + value["Ref"] + "}"
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_text(p) for p in parts)
    raise AssertionError(f"not rendered: {value}")


def _synth() -> dict[str, Any]:
    stack = cdk.Stack(cdk.App(), "S")
    topic = AlarmTopic(stack, "AlarmTopic", environment=ENV)
    for group in ENV.gpu_node_groups:
        GpuGroupAlarms(stack, f"Alarms-{group.name}", environment=ENV, group=group, topic=topic.topic)
    return dict(Template.from_stack(stack).to_json())


def _cloudwatch_statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in document["Statement"] if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]


def test_the_topic_takes_a_publish_from_this_accounts_alarms_of_this_environment_only() -> None:
    template = _synth()
    _, policy = only(template, "AWS::SNS::TopicPolicy")
    (statement,) = _cloudwatch_statements(policy["Properties"]["PolicyDocument"])
    assert statement["Action"] == "sns:Publish"
    condition = statement["Condition"]
    assert condition["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    (source,) = condition["ArnLike"].values()
    assert list(condition["ArnLike"]) == ["aws:SourceArn"]
    assert (
        _text(source)
        == f"arn:${{AWS::Partition}}:cloudwatch:${{AWS::Region}}:${{AWS::AccountId}}:alarm:{ENV.cluster.name}-*"
    )


def test_every_alarm_that_publishes_to_the_topic_is_one_the_condition_admits() -> None:
    template = _synth()
    _, policy = only(template, "AWS::SNS::TopicPolicy")
    (statement,) = _cloudwatch_statements(policy["Properties"]["PolicyDocument"])
    pattern = _text(statement["Condition"]["ArnLike"]["aws:SourceArn"]).rpartition(":alarm:")[2]
    publishing = [
        r["Properties"]["AlarmName"]
        for kind in ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm")
        for r in of_type(template, kind).values()
        if r["Properties"].get("AlarmActions")
    ]
    assert publishing
    assert all(fnmatch.fnmatchcase(name, pattern) for name in publishing), (pattern, publishing)
    # A name outside the environment is not admitted: the condition is not a wildcard on every alarm.
    assert not fnmatch.fnmatchcase("another-env-restarts", pattern)

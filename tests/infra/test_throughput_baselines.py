"""The too-slow alarm of each GPU group comes from a measured baseline only (issue 37): the committed file
infra/spec/throughput_baselines.json, written by `trainctl baseline record`. A group with a record gets an alarm at
ALARM_FRACTION of it; a group without one gets a dashboard line saying it waits for its first measured run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Template

from infra.monitoring import GpuGroupAlarms, dashboard_body, rules_for
from infra.spec import ENVIRONMENTS, ConfigError
from infra.spec import throughput_baselines as tb

RECORD: dict[str, Any] = {
    "environment": "prod",
    "group": "p5",
    "job": "nvrx-fsdp",
    "tokens_per_s": 150000.0,
    "steps": 1995,
    "model": "Qwen/Qwen2.5-1.5B",
    "instance_type": "p5.48xlarge",
    "node_count": 2,
    "source": {
        "report": "/fsx/checkpoints/nvrx-fsdp/journal.jsonl",
        "run_id": "ft-run-7",
        "run_finished": "2026-12-01T10:00:00Z",
        "fabric_gate": "PASS",
        "commit": "0123abc",
        "recorded_by": "ops",
        "recorded_at": "2026-12-01T11:00:00Z",
    },
}


def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *records: dict[str, Any]) -> Path:
    path = tmp_path / "throughput_baselines.json"
    path.write_text(json.dumps({"baselines": list(records)}))
    monkeypatch.setattr(tb, "BASELINES_FILE", path)
    return path


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tokens_per_s": 0}, "tokens_per_s"),
        ({"tokens_per_s": "fast"}, "tokens_per_s"),
        ({"instance_type": "p9.mega"}, "instance_type"),
        ({"job": "Not_A_Name"}, "job"),
        ({"steps": 3}, "steps"),
        ({"source": {**RECORD["source"], "commit": ""}}, "source.commit"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_content_is_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], field: str
) -> None:
    write(tmp_path, monkeypatch, {**RECORD, **change})
    with pytest.raises(ConfigError) as err:
        tb.load()
    assert field in err.value.field
    write(tmp_path, monkeypatch, RECORD, RECORD)
    with pytest.raises(ConfigError, match="once"):
        tb.load()


def test_a_measured_baseline_makes_the_groups_alarm_at_0_8_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, monkeypatch, RECORD)
    prod = ENVIRONMENTS["prod"]
    p5 = next(g for g in prod.gpu_node_groups if g.name == "p5")
    stack = cdk.Stack(cdk.App(), "T")
    GpuGroupAlarms(stack, "A", environment=prod, group=p5, topic=sns.Topic(stack, "Topic"))
    alarms = {
        a["Properties"]["AlarmName"]: a["Properties"]
        for a in Template.from_stack(stack).find_resources("AWS::CloudWatch::Alarm").values()
    }
    props = alarms["ml-prod-p5-throughput-nvrx-fsdp"]
    assert props["Threshold"] == pytest.approx(0.8 * 150000.0)
    assert props["ComparisonOperator"] == "LessThanThreshold"
    query = props["Metrics"][0]["Expression"]
    for where in ("JobName = 'nvrx-fsdp'", "InstanceType = 'p5.48xlarge'", "NodeCount = '2'"):
        assert where in query
    assert "ft-run-7" in props["AlarmDescription"]
    assert "0123abc" in props["AlarmDescription"]
    body = dashboard_body(prod)
    titles = [w["properties"].get("title", "") for w in body["widgets"]]
    assert "p5 (p5.48xlarge): tokens/s vs measured baseline" in titles
    texts = "\n".join(w["properties"]["markdown"] for w in body["widgets"] if w["type"] == "text")
    assert "p5 (p5.48xlarge)" not in texts
    assert "trainctl baseline record --env prod --group g6" in texts


def test_without_a_baseline_no_alarm_and_the_dashboard_says_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, monkeypatch)
    for environment in ENVIRONMENTS.values():
        texts = "\n".join(
            w["properties"]["markdown"] for w in dashboard_body(environment)["widgets"] if w["type"] == "text"
        )
        for group in environment.gpu_node_groups:
            assert rules_for(environment, group).throughput == ()
            assert f"{group.name} ({group.instance_type}): waiting for its first measured run" in texts
            assert f"trainctl baseline record --env {environment.name} --group {group.name}" in texts


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"instance_type": "p5e.48xlarge"}, "instance_type"),
        ({"node_count": 4}, "node_count"),
        ({"group": "p6"}, "group"),
    ],
)
def test_a_record_that_no_longer_fits_its_group_stops_the_synth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], field: str
) -> None:
    write(tmp_path, monkeypatch, {**RECORD, **change})
    with pytest.raises(ConfigError) as err:
        dashboard_body(ENVIRONMENTS["prod"])
    assert field in err.value.field
    assert "trainctl baseline reset" in str(err.value)

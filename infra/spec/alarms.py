"""The alarms of one GPU node group as data, and how CloudWatch evaluates them, as a pure function.

infra/monitoring.py builds the CloudWatch alarms from these rules and nothing else, so the thresholds
and windows evaluated here on recorded series (tests/infra/fixtures/metric_series) are the deployed ones.

Why CloudWatch's own features and no Lambda of ours: every condition is expressible as
- a Metrics Insights query per alarm (a SQL aggregate over the group's nodes: MAX of GPU utilisation,
  MAX of EFA bytes per interface; AVG of one job's tokens/s against that job's measured baseline,
  infra/spec/throughput_baselines.py; CloudWatch user guide, Create_Metrics_Insights_Alarm.html),
- and a composite alarm for "GPUs busy AND fabric idle" (AlarmRule `ALARM(a) AND ALARM(b) AND ALARM(c)`).
A Lambda would add a function, its role, its logs and its failure modes to watch, to compute the same.
Metrics Insights alarm limits: 200 per account and Region, the latest 3 hours evaluated.

Semantics (CloudWatch user guide, "Configuring how CloudWatch alarms treat missing data" and "Evaluating
an alarm"): at each period the last `evaluation_periods` datapoints are looked at; the alarm is ALARM
when at least `datapoints_to_alarm` of them breach; missing datapoints count as breaching
(BREACHING), as not breaching (NOT_BREACHING), keep the state while fewer than M datapoints are present
(IGNORE), or, with MISSING, are left out, and a window with none present is INSUFFICIENT_DATA. (The
rules' own treatments are BREACHING and NOT_BREACHING, whose evaluation is unambiguous.)

Why MAX: the group-level GPU signal is "some node's GPUs are busy" and the fabric signal is "no EFA
interface of the group moves data". A TCP fallback leaves every interface near zero; a healthy job on
some of the nodes keeps the MAX above the floor. (A TCP job and a healthy job at the same time in one
group hide each other: the per-job throughput alarm still sees the slow one.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from infra.spec.errors import ConfigError
from infra.spec.metrics import (
    JOB_FABRIC_GATE_FAILED,
    JOB_RESTARTS,
    JOB_TOKENS_PER_SECOND,
    NODE_EFA_RX_BYTES,
    NODE_EFA_TX_BYTES,
    NODE_GPU_UTILIZATION,
    MetricSchema,
)
from infra.spec.operating import operating_facts
from infra.spec.throughput_baselines import ALARM_FRACTION, MeasuredBaseline


class Comparison(Enum):
    GREATER = "GreaterThanThreshold"
    LESS = "LessThanThreshold"

    def breaches(self, value: float, threshold: float) -> bool:
        return value > threshold if self is Comparison.GREATER else value < threshold


class Missing(Enum):
    BREACHING = "breaching"
    NOT_BREACHING = "notBreaching"
    IGNORE = "ignore"
    MISSING = "missing"


class State(Enum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


# GPUs busy: the group's busiest GPU above this for the window.
GPU_BUSY_PERCENT = 50.0
FABRIC_WINDOW_MINUTES = 10
FABRIC_DATAPOINTS = 9
THROUGHPUT_WINDOW_MINUTES = 5
RESTARTS_PER_HOUR = 2.0
# The fabric gate's failures are summed per 5 minutes: one failed gate is worth a page (it took a node out).
FABRIC_GATE_PERIOD_S = 300


@dataclass(frozen=True, kw_only=True)
class AlarmRule:
    name: str
    description: str
    # A Metrics Insights query, or None for a plain metric (metric + dimensions + statistic).
    query: str | None
    metric: MetricSchema
    threshold: float
    comparison: Comparison
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int
    missing: Missing
    dimensions: Mapping[str, str] | None = None
    statistic: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ConfigError(f"alarms[{self.name}].datapoints_to_alarm", self.datapoints_to_alarm, "1..N")
        if self.period_s % 60:
            raise ConfigError(f"alarms[{self.name}].period_s", self.period_s, "a multiple of 60")


@dataclass(frozen=True, kw_only=True)
class GroupAlarms:
    group: str
    instance_type: str
    gpu_busy: AlarmRule
    efa_rx_idle: AlarmRule
    efa_tx_idle: AlarmRule
    throughput: tuple[tuple[MeasuredBaseline, AlarmRule], ...]
    restarts: AlarmRule
    fabric_gate: AlarmRule

    @property
    def fabric_children(self) -> tuple[AlarmRule, ...]:
        return (self.gpu_busy, self.efa_rx_idle, self.efa_tx_idle)


def _where(**equals: str) -> str:
    return " AND ".join(f"{k} = '{v}'" for k, v in equals.items())


def throughput_rule(group: str, baseline: MeasuredBaseline) -> AlarmRule:
    """The job's tokens/s under ALARM_FRACTION of its measured baseline for the whole window. The job, instance type
    and node count select the series the record was measured on (training/emf.py THROUGHPUT_DIMENSIONS)."""
    return AlarmRule(
        name=f"{group}-throughput-{baseline.job}",
        description=(
            f"Job {baseline.job}'s tokens/s on {baseline.node_count} x {baseline.instance_type} (group {group}) under "
            f"{ALARM_FRACTION:.0%} of its measured baseline {baseline.tokens_per_s:.0f} ({baseline.model}; "
            f"{baseline.cited()}). A slow success: check the fabric (trainctl logs --fabric) and the "
            "fabric-idle alarm; after an intended change: trainctl baseline reset, then record the next run"
        ),
        query=(
            f"SELECT AVG({JOB_TOKENS_PER_SECOND.name}) FROM {JOB_TOKENS_PER_SECOND.schema()} WHERE "
            + _where(JobName=baseline.job, InstanceType=baseline.instance_type, NodeCount=str(baseline.node_count))
        ),
        metric=JOB_TOKENS_PER_SECOND,
        threshold=baseline.alarm_tokens_per_s,
        comparison=Comparison.LESS,
        period_s=60,
        evaluation_periods=THROUGHPUT_WINDOW_MINUTES,
        datapoints_to_alarm=THROUGHPUT_WINDOW_MINUTES,
        # No job running publishes nothing: that is not slowness.
        missing=Missing.NOT_BREACHING,
    )


def group_alarm_rules(
    *, cluster: str, group: str, instance_type: str, baselines: Sequence[MeasuredBaseline] = ()
) -> GroupAlarms:
    """`baselines`: the group's measured records (infra/spec/throughput_baselines.py for_group), one alarm each."""
    facts = operating_facts(instance_type, field=f"gpu_node_groups[{group}].instance_type")
    node = _where(ClusterName=cluster, InstanceType=instance_type)
    floor = facts.efa_idle_floor_bytes_per_s
    fabric: dict[str, Any] = {
        "period_s": 60,
        "evaluation_periods": FABRIC_WINDOW_MINUTES,
        "datapoints_to_alarm": FABRIC_DATAPOINTS,
    }

    def efa(metric: MetricSchema, direction: str) -> AlarmRule:
        return AlarmRule(
            name=f"{group}-efa-{direction}-idle",
            description=(
                f"Every EFA interface of GPU group {group} ({instance_type}) {direction} under "
                f"{floor:.0f} B/s ({facts.efa_idle_floor_fraction:.0%} of its link rate)"
            ),
            query=f"SELECT MAX({metric.name}) FROM {metric.schema()} WHERE {node}",
            metric=metric,
            threshold=floor,
            comparison=Comparison.LESS,
            # No EFA datapoints while GPUs report busy is itself suspicious.
            missing=Missing.BREACHING,
            **fabric,
        )

    throughput = tuple((baseline, throughput_rule(group, baseline)) for baseline in baselines)
    return GroupAlarms(
        group=group,
        instance_type=instance_type,
        gpu_busy=AlarmRule(
            name=f"{group}-gpu-busy",
            description=f"A GPU of group {group} ({instance_type}) above {GPU_BUSY_PERCENT:.0f}% utilisation",
            query=f"SELECT MAX({NODE_GPU_UTILIZATION.name}) FROM {NODE_GPU_UTILIZATION.schema()} WHERE {node}",
            metric=NODE_GPU_UTILIZATION,
            threshold=GPU_BUSY_PERCENT,
            comparison=Comparison.GREATER,
            missing=Missing.NOT_BREACHING,
            **fabric,
        ),
        efa_rx_idle=efa(NODE_EFA_RX_BYTES, "rx"),
        efa_tx_idle=efa(NODE_EFA_TX_BYTES, "tx"),
        throughput=throughput,
        restarts=AlarmRule(
            name=f"{group}-restarts",
            description=f"More than {RESTARTS_PER_HOUR:.0f} training restarts in an hour on {instance_type}",
            query=None,
            metric=JOB_RESTARTS,
            dimensions={"InstanceType": instance_type},
            statistic="Sum",
            threshold=RESTARTS_PER_HOUR,
            comparison=Comparison.GREATER,
            period_s=3600,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=Missing.NOT_BREACHING,
        ),
        fabric_gate=AlarmRule(
            name=f"{group}-fabric-gate-failed",
            description=(
                f"A job's fabric gate failed on {instance_type} (group {group}): it tainted the suspect node "
                "platform/fabric-gate:NoSchedule and the job is re-placed, or failed after its bounded retries. "
                "See which node and why: trainctl status, kubectl describe node NODE (Event FabricGateFailed). "
                "After repair: kubectl taint node NODE platform/fabric-gate:NoSchedule- (docs/fabric-and-alarms.md)"
            ),
            query=None,
            metric=JOB_FABRIC_GATE_FAILED,
            dimensions={"InstanceType": instance_type},
            statistic="Sum",
            threshold=0.0,
            comparison=Comparison.GREATER,
            period_s=FABRIC_GATE_PERIOD_S,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            # No gate ran (no job started): nothing failed.
            missing=Missing.NOT_BREACHING,
        ),
    )


def evaluate(rule: AlarmRule, series: Sequence[float | None], *, start: State = State.INSUFFICIENT_DATA) -> list[State]:
    """The alarm state after each period of `series` (one value per period, None = missing)."""
    states: list[State] = []
    state = start
    for end in range(1, len(series) + 1):
        window = series[max(0, end - rule.evaluation_periods) : end]
        if rule.missing is Missing.BREACHING:
            flags = [v is None or rule.comparison.breaches(v, rule.threshold) for v in window]
        elif rule.missing is Missing.NOT_BREACHING:
            flags = [v is not None and rule.comparison.breaches(v, rule.threshold) for v in window]
        else:
            flags = [rule.comparison.breaches(v, rule.threshold) for v in window if v is not None]
            if rule.missing is Missing.IGNORE and len(flags) < rule.datapoints_to_alarm:
                # Too few datapoints to decide either way: IGNORE keeps the current state.
                states.append(state)
                continue
            if not flags:
                # IGNORE keeps the state; MISSING has nothing to evaluate.
                state = state if rule.missing is Missing.IGNORE else State.INSUFFICIENT_DATA
                states.append(state)
                continue
        state = State.ALARM if sum(flags) >= rule.datapoints_to_alarm else State.OK
        states.append(state)
    return states


def final_state(rule: AlarmRule, series: Sequence[float | None]) -> State:
    states = evaluate(rule, series)
    return states[-1] if states else State.INSUFFICIENT_DATA


def composite_and(*states: State) -> State:
    """A composite alarm `ALARM(a) AND ALARM(b) ...`: ALARM only while every child is in ALARM."""
    return State.ALARM if states and all(s is State.ALARM for s in states) else State.OK


def fabric_idle_state(alarms: GroupAlarms, series: Mapping[str, Sequence[float | None]]) -> State:
    """The composite "GPUs busy, fabric idle" alarm over recorded series keyed by metric name."""
    return composite_and(*(final_state(rule, series[rule.metric.name]) for rule in alarms.fabric_children))

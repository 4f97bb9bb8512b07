"""Step throughput a job should reach, per (model, instance type, node count): the floor of the
"throughput under baseline" alarm (infra/spec/alarms.py) and the reference of the goodput ledger's
slow steps (trainctl goodput).

How to update: run the job on EFA (the fabric A/B of `trainctl fabric-check` first), read its
steady-state tokens/s (the median of `TokensPerSecond` in CloudWatch, namespace MLPlatform/Training,
or `trainctl goodput --json` -> steps), and replace or add the entry below with that figure, the run
and the date in `source`. The alarm fires under `alarm_fraction` x tokens_per_s.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from infra.spec.errors import ConfigError
from infra.spec.instances import INSTANCE_TYPES


@dataclass(frozen=True, kw_only=True)
class ThroughputBaseline:
    model: str
    instance_type: str
    node_count: int
    tokens_per_s: float
    # Tokens of one optimizer step over all ranks: turns tokens/s into seconds per step.
    tokens_per_step: int
    source: str
    alarm_fraction: float = 0.8

    def __post_init__(self) -> None:
        where = f"baselines[{self.model}, {self.instance_type}, {self.node_count}]"
        if self.instance_type not in INSTANCE_TYPES:
            raise ConfigError(f"{where}.instance_type", self.instance_type, INSTANCE_TYPES)
        if self.node_count < 1:
            raise ConfigError(f"{where}.node_count", self.node_count, ">= 1")
        if not self.tokens_per_s > 0 or self.tokens_per_step < 1:
            raise ConfigError(f"{where}.tokens_per_s", self.tokens_per_s, "> 0, with tokens_per_step >= 1")
        if not 0 < self.alarm_fraction < 1:
            raise ConfigError(f"{where}.alarm_fraction", self.alarm_fraction, "between 0 and 1, e.g. 0.8")

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.model, self.instance_type, self.node_count)

    @property
    def alarm_tokens_per_s(self) -> float:
        return self.alarm_fraction * self.tokens_per_s

    @property
    def step_time_s(self) -> float:
        return self.tokens_per_step / self.tokens_per_s


# Seed: the AWS Ray Train DLC sample's published fabric A/B on 2 x g6.12xlarge (aws-samples/
# sample-aws-deep-learning-containers, training/ray-train/: EFA 0.5173 steps/s, TCP 0.2513) at this
# platform's RayJob geometry (k8s/workloads.py: batch 4 x 1024 tokens x 8 workers = 32,768 tokens per step).
# The sample's own batch geometry may differ: replace with the first measured run.
_SAMPLE_STEPS_PER_S = 0.5173
_RAY_TOKENS_PER_STEP = 4 * 1024 * 8

_BASELINES = (
    ThroughputBaseline(
        model="Qwen/Qwen2.5-1.5B",
        instance_type="g6.12xlarge",
        node_count=2,
        tokens_per_s=_SAMPLE_STEPS_PER_S * _RAY_TOKENS_PER_STEP,
        tokens_per_step=_RAY_TOKENS_PER_STEP,
        source="aws-samples/sample-aws-deep-learning-containers training/ray-train EFA A/B (0.5173 steps/s), seed",
    ),
)

BASELINES: MappingProxyType[tuple[str, str, int], ThroughputBaseline] = MappingProxyType({b.key: b for b in _BASELINES})


def baselines_for(instance_type: str) -> tuple[ThroughputBaseline, ...]:
    return tuple(b for b in _BASELINES if b.instance_type == instance_type)

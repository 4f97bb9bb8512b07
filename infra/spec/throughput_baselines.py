"""Measured throughput baselines: the only source of a GPU group's "throughput under baseline" alarm.

One record per (environment, GPU group, job) in throughput_baselines.json beside this module, written by
`trainctl baseline record` from the job's own report of a fabric-gated run (the NVRx journal or the Ray
fine-tune's --output-json) and removed by `trainctl baseline reset`. Each record carries its provenance: the
report, the run, the gate's verdict, the commit, who recorded it and when. The alarm fires under ALARM_FRACTION
of the record (infra/spec/alarms.py); a group with no record has no such alarm and its dashboard row says it
waits for its first measured run. No figure here is typed by hand or taken from elsewhere: a number nobody
measured on this platform would page on a guess.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra.spec.errors import ConfigError
from infra.spec.instances import INSTANCE_TYPES

BASELINES_FILE = Path(__file__).with_name("throughput_baselines.json")
# The alarm fires when a job's tokens/s stays under this fraction of its measured baseline for the alarm's window
# (5 minutes, infra/spec/alarms.py): a TCP fallback runs at about half the EFA rate (the fabric A/B, docs), and
# step-to-step noise of a healthy run stays well inside 20 %.
ALARM_FRACTION = 0.8
# A baseline is the median tokens/s of the steady steps: the first WARMUP_STEPS of each process (kernel
# compilation, the allocator, NCCL's first collectives) are left out, and at least MIN_MEASURED_STEPS must remain.
WARMUP_STEPS = 5
MIN_MEASURED_STEPS = 50

_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_RESET = "remove it with `trainctl baseline reset --env {env} --group {group} --job {job}` and record a new run"


@dataclass(frozen=True, kw_only=True)
class Provenance:
    report: str
    run_id: str | None
    run_finished: str
    fabric_gate: str
    commit: str
    recorded_by: str
    recorded_at: str


@dataclass(frozen=True, kw_only=True)
class MeasuredBaseline:
    environment: str
    group: str
    job: str
    tokens_per_s: float
    steps: int
    model: str
    instance_type: str
    node_count: int
    source: Provenance

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.environment, self.group, self.job)

    @property
    def alarm_tokens_per_s(self) -> float:
        return ALARM_FRACTION * self.tokens_per_s

    def cited(self) -> str:
        """The record in one line, for the alarm's description."""
        run = f"run {self.source.run_id}" if self.source.run_id else "run"
        return (
            f"{run} finished {self.source.run_finished}, at commit {self.source.commit}, recorded by "
            f"{self.source.recorded_by} at {self.source.recorded_at} (infra/spec/throughput_baselines.json)"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _require(where: str, record: Mapping[str, Any], name: str, kind: type | tuple[type, ...], allowed: str) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{where}.{name}", value, allowed, "record it with `trainctl baseline record`")
    return value


def _text(where: str, record: Mapping[str, Any], name: str, *, optional: bool = False) -> str | None:
    value = record.get(name)
    if optional and value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}.{name}", value, "a non-empty string", "record it with `trainctl baseline record`")
    return value


def _exact_keys(where: str, record: Any, keys: Iterable[str]) -> Mapping[str, Any]:
    expected = set(keys)
    if not isinstance(record, Mapping):
        raise ConfigError(where, record, f"an object with {', '.join(sorted(expected))}")
    for extra in sorted(set(record) - expected):
        raise ConfigError(f"{where}.{extra}", record[extra], sorted(expected), "remove the unknown key")
    for missing in sorted(expected - set(record)):
        raise ConfigError(f"{where}.{missing}", None, "present", "record it with `trainctl baseline record`")
    return record


def parse_record(record: Any, index: int) -> MeasuredBaseline:
    where = f"throughput_baselines[{index}]"
    fields = [f for f in MeasuredBaseline.__dataclass_fields__]
    record = _exact_keys(where, record, fields)
    for name in ("environment", "group", "job"):
        value = record[name]
        if not isinstance(value, str) or not _NAME.match(value):
            raise ConfigError(f"{where}.{name}", value, "lower-case letters, digits and '-', starting with a letter")
    tokens = _require(where, record, "tokens_per_s", (int, float), "a number of tokens per second above 0")
    if not (math.isfinite(tokens) and tokens > 0):
        raise ConfigError(f"{where}.tokens_per_s", tokens, "a number of tokens per second above 0")
    steps = _require(where, record, "steps", int, f"the steady steps measured, at least {MIN_MEASURED_STEPS}")
    if steps < MIN_MEASURED_STEPS:
        raise ConfigError(f"{where}.steps", steps, f"at least {MIN_MEASURED_STEPS} steady steps", "record a longer run")
    if record["instance_type"] not in INSTANCE_TYPES:
        raise ConfigError(f"{where}.instance_type", record["instance_type"], INSTANCE_TYPES)
    nodes = _require(where, record, "node_count", int, "1 or more")
    if nodes < 1:
        raise ConfigError(f"{where}.node_count", nodes, "1 or more")
    source_where = f"{where}.source"
    source = _exact_keys(source_where, record["source"], Provenance.__dataclass_fields__)
    texts = {name: _text(source_where, source, name) for name in ("report", "fabric_gate", "commit", "recorded_by")}
    for name in ("run_finished", "recorded_at"):
        value = source[name]
        if not isinstance(value, str) or not _TIME.match(value):
            raise ConfigError(f"{source_where}.{name}", value, "a UTC time, YYYY-MM-DDTHH:MM:SSZ")
    return MeasuredBaseline(
        environment=record["environment"],
        group=record["group"],
        job=record["job"],
        tokens_per_s=float(tokens),
        steps=steps,
        model=str(_text(where, record, "model")),
        instance_type=record["instance_type"],
        node_count=nodes,
        source=Provenance(
            run_id=_text(source_where, source, "run_id", optional=True),
            run_finished=source["run_finished"],
            recorded_at=source["recorded_at"],
            **{k: str(v) for k, v in texts.items()},
        ),
    )


def parse(document: Any) -> tuple[MeasuredBaseline, ...]:
    document = _exact_keys("throughput_baselines", document, ("baselines",))
    records = document["baselines"]
    if not isinstance(records, list):
        raise ConfigError("throughput_baselines.baselines", records, "a list of records")
    baselines = tuple(parse_record(record, index) for index, record in enumerate(records))
    seen: set[tuple[str, str, str]] = set()
    for baseline in baselines:
        if baseline.key in seen:
            env, group, job = baseline.key
            raise ConfigError(
                "throughput_baselines",
                "/".join(baseline.key),
                "each (environment, group, job) once",
                _RESET.format(env=env, group=group, job=job),
            )
        seen.add(baseline.key)
    return baselines


def load(path: Path | None = None) -> tuple[MeasuredBaseline, ...]:
    """The records of `path` (default: BASELINES_FILE, read at each call), validated."""
    path = path or BASELINES_FILE
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("throughput_baselines", str(path), "a readable JSON file", str(exc)) from None
    return parse(document)


def dumps(baselines: Iterable[MeasuredBaseline]) -> str:
    """The file's text: records sorted by their key, stable across runs (a diff shows what changed)."""
    ordered = sorted(baselines, key=lambda b: b.key)
    return json.dumps({"baselines": [b.to_json() for b in ordered]}, indent=2, sort_keys=True) + "\n"


def for_group(
    baselines: Iterable[MeasuredBaseline], *, environment: str, group: str, instance_type: str, node_count: int
) -> tuple[MeasuredBaseline, ...]:
    """The group's records; one measured on another instance type or node count no longer describes its jobs."""
    mine = tuple(b for b in baselines if (b.environment, b.group) == (environment, group))
    for b in mine:
        fix = _RESET.format(env=b.environment, group=b.group, job=b.job)
        where = f"throughput_baselines[{b.environment}/{b.group}/{b.job}]"
        if b.instance_type != instance_type:
            raise ConfigError(f"{where}.instance_type", b.instance_type, f"{instance_type} (the group's now)", fix)
        if b.node_count != node_count:
            raise ConfigError(f"{where}.node_count", b.node_count, f"{node_count} (the group's workload_nodes)", fix)
    return mine


def check_groups_exist(baselines: Iterable[MeasuredBaseline], *, environment: str, groups: Iterable[str]) -> None:
    """A record of a group the environment no longer has is refused: it would never alarm, and look as if it did."""
    names = sorted(groups)
    for b in (b for b in baselines if b.environment == environment and b.group not in names):
        raise ConfigError(
            f"throughput_baselines[{b.environment}/{b.group}/{b.job}].group",
            b.group,
            names,
            _RESET.format(env=b.environment, group=b.group, job=b.job),
        )

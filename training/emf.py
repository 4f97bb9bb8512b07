"""Step throughput and restarts as CloudWatch embedded metric format (EMF) log lines.

The structure follows "Specification: Embedded metric format" (CloudWatch user guide,
CloudWatch_Embedded_Metric_Format_Specification.html): a JSON object whose `_aws` member holds
`Timestamp` (milliseconds since the epoch) and `CloudWatchMetrics`, an array of directives
`{Namespace, Dimensions: [[name, ...], ...], Metrics: [{Name, Unit}, ...]}`; every dimension and
metric a directive names is a member at the root (dimension values strings, metric values numbers).

How a line reaches CloudWatch. Each line is printed on stdout, and the container's stdout is the log
the kubelet writes. The observability add-on's Fluent Bit tails the container logs of the workload
namespaces (`training`, `ray`) and of no other, decodes each line as JSON, keeps the EMF objects whose
directives all name NAMESPACE and writes each as one event to the cluster's EMF log group, a group its
configuration names (infra/addons/observability.py training_emf_pipeline, infra/spec/metrics.py);
CloudWatch Logs extracts the metrics from those events. A pod of another namespace is never read, and
the group is not the line's to choose. Nothing listens for EMF on the nodes: the CloudWatch agent's EMF
listener (port 25888), which wrote a line to whatever group it named, is off (issue 38).

A process whose stdout is not the container's also writes each line to the container's stdout, named in
CONTAINER_LOG_ENV: a Ray worker's training processes write to Ray's log files under /tmp/ray, which
reach `kubectl logs` only through the driver, prefixed with the actor (`(RayTrainWorker pid=..., ip=...)`),
and never as a line of their own container's log (k8s/ray_spec.py sets it on the Ray workers only; an
NVRx worker inherits the container's stdout from ft_launcher, and a second copy would count each step
twice). The stdout copy stays for `kubectl logs` and the driver log.

This module is pure standard library: it ships to the pods with the rest of training/ and is
imported by infra/spec/metrics.py, so the names below are the one place the alarms read them from.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

NAMESPACE = "MLPlatform/Training"
TOKENS_PER_SECOND = "TokensPerSecond"
STEP_TIME = "StepTime"
RESTARTS = "Restarts"
# The fabric gate's (training/fabric_gate.py): 1 for a failed gate (FAIL or UNKNOWN), 0 for a pass; its cost and the
# bus bandwidth it measured. The GPU group's gate alarm reads FABRIC_GATE_FAILED per instance type.
FABRIC_GATE_FAILED = "FabricGateFailed"
FABRIC_GATE_SECONDS = "FabricGateSeconds"
FABRIC_GATE_BUSBW = "FabricGateBusBandwidth"
# Dimension names, in the order of the widest dimension set.
JOB_NAME = "JobName"
MODEL = "Model"
INSTANCE_TYPE = "InstanceType"
NODE_COUNT = "NodeCount"
# Per job (alarm contributors) and per (model, instance type, node count) (the baseline's key).
THROUGHPUT_DIMENSIONS: tuple[tuple[str, ...], ...] = (
    (JOB_NAME, MODEL, INSTANCE_TYPE, NODE_COUNT),
    (MODEL, INSTANCE_TYPE, NODE_COUNT),
)
# Restarts per instance type: the GPU node group's alarm reads them.
RESTART_DIMENSIONS: tuple[tuple[str, ...], ...] = ((INSTANCE_TYPE,), (JOB_NAME, INSTANCE_TYPE))
FABRIC_GATE_DIMENSIONS = RESTART_DIMENSIONS

# Set on the pods by the workload charts; the fallbacks keep CPU runs and tests working.
# Where a process whose stdout is not the container's writes a second copy of each line (Ray workers).
CONTAINER_LOG_ENV = "PLATFORM_EMF_CONTAINER_LOG"
# The container's stdout from any process in it: the standard output of the container's first process (proc(5),
# /proc/[pid]/fd), the stream the container runtime hands to the kubelet's log.
CONTAINER_STDOUT = "/proc/1/fd/1"
JOB_NAME_ENV = "PLATFORM_JOB_NAME"
INSTANCE_TYPE_ENV = "PLATFORM_INSTANCE_TYPE"

# The units CloudWatch accepts (PutMetricData MetricDatum.Unit, which EMF's Unit refers to).
UNITS = frozenset(
    {
        *("Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes"),
        *("Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second"),
        *("Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second"),
        *("Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"),
    }
)


@dataclass(frozen=True, kw_only=True)
class JobIdentity:
    """The dimensions every line of one job carries."""

    job_name: str
    model: str
    instance_type: str
    node_count: int

    def dimensions(self) -> dict[str, str]:
        return {
            JOB_NAME: self.job_name,
            MODEL: self.model,
            INSTANCE_TYPE: self.instance_type,
            NODE_COUNT: str(self.node_count),
        }

    def report_fields(self) -> dict[str, Any]:
        """The identity in the job's own report (the NVRx journal's start event, the Ray step reports): what
        `trainctl baseline record` checks a run against its GPU group with."""
        return {
            "job_name": self.job_name,
            "model": self.model,
            "instance_type": self.instance_type,
            "node_count": self.node_count,
        }


def model_name(model: str) -> str:
    """A hub id stays as it is; a local directory is named by its last component."""
    return Path(model).name if Path(model).is_dir() else model


def identity_from_env(
    *, model: str, world_size: int, local_world_size: int, default_job: str, env: Mapping[str, str] | None = None
) -> JobIdentity:
    values = os.environ if env is None else env
    return JobIdentity(
        job_name=values.get(JOB_NAME_ENV) or default_job,
        model=model_name(model),
        instance_type=values.get(INSTANCE_TYPE_ENV) or "unknown",
        node_count=max(1, world_size // max(1, local_world_size)),
    )


def document(
    metrics: Mapping[str, tuple[float, str]],
    dimensions: Mapping[str, str],
    dimension_sets: tuple[tuple[str, ...], ...],
    *,
    timestamp_ms: int | None = None,
    properties: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One EMF object; metrics maps a name to (value, unit)."""
    for name, (_, unit) in metrics.items():
        if unit not in UNITS:
            raise ValueError(f"EMF metric {name}: unit {unit!r} is not a CloudWatch unit ({sorted(UNITS)})")
    for dimension_set in dimension_sets:
        missing = [d for d in dimension_set if d not in dimensions]
        if missing:
            raise ValueError(f"EMF dimension set {list(dimension_set)} names {missing}, which have no value")
    return {
        "_aws": {
            "Timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [list(d) for d in dimension_sets],
                    "Metrics": [{"Name": name, "Unit": unit} for name, (_, unit) in metrics.items()],
                }
            ],
        },
        **(properties or {}),
        **dimensions,
        **{name: value for name, (value, _) in metrics.items()},
    }


def throughput(identity: JobIdentity, *, step: int, step_time_s: float, tokens: int, world_size: int) -> dict[str, Any]:
    return document(
        {TOKENS_PER_SECOND: (tokens / step_time_s, "Count/Second"), STEP_TIME: (step_time_s, "Seconds")},
        identity.dimensions(),
        THROUGHPUT_DIMENSIONS,
        properties={"Step": step, "WorldSize": world_size, "Tokens": tokens},
    )


def restart(identity: JobIdentity, *, restart_count: int, iteration: int) -> dict[str, Any]:
    return document(
        {RESTARTS: (1, "Count")},
        identity.dimensions(),
        RESTART_DIMENSIONS,
        properties={"TorchelasticRestart": restart_count, "InprocessIteration": iteration},
    )


@dataclass
class Emitter:
    """Writes each document as one line to `out` and, when a container log is set, to it too.

    The container log is best effort: a training step never fails because of it; the first failure is reported
    once on stderr."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    container_log: str | None = field(default_factory=lambda: os.environ.get(CONTAINER_LOG_ENV) or None)
    _warned: bool = False

    def emit(self, doc: dict[str, Any]) -> None:
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        self.out.write(line)
        self.out.flush()
        if self.container_log is not None:
            self._copy(line)

    def _copy(self, line: str) -> None:
        assert self.container_log is not None
        try:
            # One write of the whole line, appended: lines of several writers to the same pipe stay whole (a pipe
            # write of at most PIPE_BUF bytes is atomic, pipe(7)).
            with open(self.container_log, "a", encoding="utf-8") as stream:
                stream.write(line)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"[emf] cannot write to the container's log {self.container_log}: {exc}", file=sys.stderr)


def process_start_time() -> float | None:
    """When this process started (seconds since the epoch), from /proc/self/stat field 22 (clock ticks
    after boot, proc(5)) and /proc/uptime; None where /proc is missing. Covers imports and model load,
    which happen before the first journal event."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    started_ticks = int(fields[19])  # field 22 overall; fields here start at field 3
    return time.time() - (uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The EMF documents among log lines (any line that is a JSON object with an `_aws` member)."""
    found: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and "_aws" in value:
            found.append(value)
    return found

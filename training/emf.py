"""Step throughput and restarts as CloudWatch embedded metric format (EMF) log lines.

The structure follows "Specification: Embedded metric format" (CloudWatch user guide,
CloudWatch_Embedded_Metric_Format_Specification.html): a JSON object whose `_aws` member holds
`Timestamp` (milliseconds since the epoch) and `CloudWatchMetrics`, an array of directives
`{Namespace, Dimensions: [[name, ...], ...], Metrics: [{Name, Unit}, ...]}`; every dimension and
metric a directive names is a member at the root (dimension values strings, metric values numbers).

How a line reaches CloudWatch. Container stdout is shipped by the add-on's Fluent Bit wrapped in a
JSON envelope with Kubernetes metadata (a "log" field), and CloudWatch Logs extracts metrics only
from an event that IS the EMF object ("The LogEvent message must be a valid JSON object with no
additional data at the beginning or end"), so stdout alone produces no metric. The line is also
sent to the CloudWatch agent's EMF endpoint: with `logs.metrics_collected.emf` in its configuration
the agent listens on port 25888 TCP/UDP, and the amazon-cloudwatch-agent-operator opens that port on
the agent's Service (`emf-tcp`/`emf-udp`, operator internal/manifests/collector/ports.go;
infra/addons/observability.py turns it on). Pods name it in AWS_EMF_AGENT_ENDPOINT
(tcp://cloudwatch-agent.amazon-cloudwatch:25888), the variable the aws-embedded-metrics libraries
read; the agent writes each line to CloudWatch Logs, which extracts the metrics. Stdout keeps a copy
for `kubectl logs` and for `trainctl goodput`.

This module is pure standard library: it ships to the pods with the rest of training/ and is
imported by infra/spec/metrics.py, so the names below are the one place the alarms read them from.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

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
AGENT_ENDPOINT_ENV = "AWS_EMF_AGENT_ENDPOINT"
# Unset on the platform's pods: the agent then writes to its default group, the only EMF group its role may write
# (infra/spec/metrics.py EMF_LOG_GROUP); a line naming another group is refused.
LOG_GROUP_ENV = "AWS_EMF_LOG_GROUP_NAME"
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
    """Writes each document as one line to `out` and, when an agent endpoint is set, sends it there.

    The agent is best effort: a training step never waits more than `timeout_s` for it and never
    fails because of it; the first failure is reported once on stderr."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    endpoint: str | None = field(default_factory=lambda: os.environ.get(AGENT_ENDPOINT_ENV) or None)
    log_group: str | None = field(default_factory=lambda: os.environ.get(LOG_GROUP_ENV) or None)
    timeout_s: float = 0.5
    _warned: bool = False

    def emit(self, doc: dict[str, Any]) -> None:
        self.out.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self.out.flush()
        if self.endpoint is not None:
            self._send(doc)

    def _send(self, doc: dict[str, Any]) -> None:
        assert self.endpoint is not None
        payload = dict(doc)
        if self.log_group is not None:
            # The agent reads the destination group from _aws.LogGroupName (CloudWatch user guide,
            # "Using the CloudWatch agent to send embedded metric format logs").
            payload["_aws"] = {**doc["_aws"], "LogGroupName": self.log_group}
        data = (json.dumps(payload, separators=(",", ":")) + "\n").encode()
        try:
            scheme, host, port = parse_endpoint(self.endpoint)
            if scheme == "udp":
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    sock.sendto(data, (host, port))
            else:
                with socket.create_connection((host, port), timeout=self.timeout_s) as sock:
                    sock.sendall(data)
        except (OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                print(f"[emf] cannot send to the CloudWatch agent at {self.endpoint}: {exc}", file=sys.stderr)


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


def parse_endpoint(endpoint: str) -> tuple[str, str, int]:
    """tcp://host:port or udp://host:port (the aws-embedded-metrics AWS_EMF_AGENT_ENDPOINT form)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("tcp", "udp") or not parts.hostname or parts.port is None:
        raise ValueError(
            f"{AGENT_ENDPOINT_ENV}={endpoint!r} is not tcp://HOST:PORT or udp://HOST:PORT, "
            "e.g. tcp://cloudwatch-agent.amazon-cloudwatch:25888"
        )
    return parts.scheme, parts.hostname, parts.port


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

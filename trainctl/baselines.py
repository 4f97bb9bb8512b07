"""A GPU group's measured throughput baseline from a job's own report (trainctl/commands/baseline.py is the command).

The report is what `trainctl goodput` reads (trainctl.goodput.read_records): the NVRx journal, whose rank-0 start
events name the job, its instance type and nodes and the fabric gate's outcome and whose step events carry the
tokens of the step, or the Ray fine-tune's --output-json, whose step reports carry the same. A run becomes a
baseline only when it is the group's workload (its instance type and workload_nodes), passed the fabric gate where
the group's jobs are gated, and has at least MIN_MEASURED_STEPS steady steps; the baseline is their median tokens/s
(infra/spec/throughput_baselines.py). The file is rewritten only after the new content validates.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.spec import ENVIRONMENTS, Environment, GpuNodeGroupConfig
from infra.spec import throughput_baselines as tb
from trainctl.goodput import GoodputError, read_records
from training.fabric_gate import Outcome
from training.journal import Event

IDENTITY = ("job_name", "model", "instance_type", "node_count")


class BaselineError(ValueError):
    """Bad input: the field, the value and the fix; nothing was written."""

    def __init__(self, field: str, value: object, why: str, fix: str) -> None:
        super().__init__(f"{field}={value!r}: {why}. Fix: {fix}")


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What a report says about one run, before it is checked against a group."""

    kind: str
    identity: dict[str, Any]
    fabric_gate: str | None
    tokens_per_s: list[float]
    run_id: str | None
    finished: float


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gate(outcomes: Iterable[Any]) -> str:
    """PASS when every record says PASS; else the other outcomes (a missing one reads None)."""
    found = sorted({str(outcome) for outcome in outcomes})
    return ", ".join(o for o in found if o != Outcome.PASS.value) or Outcome.PASS.value


def _steady(attempts: dict[Any, list[float]]) -> list[float]:
    """Each attempt's tokens/s but its first WARMUP_STEPS (compilation, allocator, NCCL's first collectives)."""
    return [value for values in attempts.values() for value in values[tb.WARMUP_STEPS :]]


def _nvrx(events: list[dict[str, Any]], path: Path) -> Measurement:
    starts = [e for e in events if e["event"] == Event.START and e.get("rank") == 0 and e.get("iteration", 0) == 0]
    if not starts:
        raise BaselineError("report", str(path), "the journal has no start event of rank 0", "pass the job's journal")
    identity = {k: starts[0].get(k) for k in IDENTITY}
    # Every process start must have passed; a restarted process runs the gate again (or finds it proven in its pod).
    gate = _gate(e.get("fabric_gate") for e in starts)
    attempts: dict[Any, list[float]] = {}
    for e in events:
        if e["event"] == Event.STEP:
            if not e.get("tokens"):
                raise BaselineError(
                    "report",
                    str(path),
                    f"step {e.get('step')} has no `tokens`: the journal predates the platform's throughput fields",
                    "record a run of the current trainer (training/nvrx_fsdp.py)",
                )
            key = (e.get("run_id"), e.get("restart"), e.get("iteration"))
            attempts.setdefault(key, []).append(e["tokens"] / e["seconds"])
    run_ids = sorted({str(e["run_id"]) for e in starts if e.get("run_id")})
    return Measurement(
        kind="nvrx",
        identity=identity,
        fabric_gate=gate,
        tokens_per_s=_steady(attempts),
        run_id=",".join(run_ids) or None,
        finished=max(float(e["time"]) for e in events),
    )


def _ray(reports: list[dict[str, Any]], path: Path) -> Measurement:
    steps = [r for r in reports if "tokens_per_s" in r and not r.get("final")]
    if not steps or any("time" not in r for r in steps):
        raise BaselineError("report", str(path), "no step reports with tokens_per_s and time", "pass --output-json")
    gate = _gate(r.get("fabric_gate") for r in steps)
    return Measurement(
        kind="ray",
        identity={k: steps[0].get(k) for k in IDENTITY},
        fabric_gate=gate,
        tokens_per_s=_steady({None: [float(r["tokens_per_s"]) for r in steps]}),
        run_id=None,
        finished=max(float(r["time"]) for r in steps),
    )


def measure(path: Path) -> Measurement:
    try:
        kind, records = read_records(path)
    except GoodputError as exc:
        raise BaselineError("report", str(path), str(exc), "pass the job's journal.jsonl or --output-json") from None
    if not records:
        raise BaselineError("report", str(path), "the report is empty", "pass the report of a finished run")
    try:
        return _nvrx(records, path) if kind == "nvrx" else _ray(records, path)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, BaselineError):
            raise
        why = f"a record lacks or garbles a field ({type(exc).__name__}: {exc})"
        raise BaselineError("report", str(path), why, "pass the report the job wrote, unedited") from None


def group_of(env: str, group: str) -> tuple[Environment, GpuNodeGroupConfig]:
    environment = ENVIRONMENTS[env]
    names = [g.name for g in environment.gpu_node_groups]
    for candidate in environment.gpu_node_groups:
        if candidate.name == group:
            return environment, candidate
    raise BaselineError("--group", group, f"not a GPU group of {env} ({', '.join(names) or 'none'})", "name one")


def check(measurement: Measurement, group: GpuNodeGroupConfig, *, job: str) -> None:
    """The run is the group's workload, fabric-verified where gated, and long enough; else BaselineError."""
    identity = measurement.identity
    if any(identity[k] is None for k in IDENTITY):
        missing = [k for k in IDENTITY if identity[k] is None]
        raise BaselineError(
            "report",
            ", ".join(missing),
            "the report does not name its job, model, instance type and nodes (training/emf.py report_fields)",
            "record a run of the current trainer",
        )
    if identity["job_name"] != job:
        raise BaselineError("--job", job, f"the report is of job {identity['job_name']}", "name the report's job")
    if identity["instance_type"] != group.instance_type:
        raise BaselineError(
            "instance_type",
            identity["instance_type"],
            f"group {group.name} runs {group.instance_type}",
            "record a run of this group",
        )
    if identity["node_count"] != group.workload_nodes:
        raise BaselineError(
            "node_count",
            identity["node_count"],
            f"group {group.name}'s jobs use {group.workload_nodes} nodes (workload_nodes)",
            f"record a {group.workload_nodes}-node run",
        )
    if group.gated and measurement.fabric_gate != Outcome.PASS.value:
        raise BaselineError(
            "fabric_gate",
            measurement.fabric_gate,
            f"group {group.name}'s jobs are gated and a baseline must be measured on a verified fabric "
            "(every process start of the run passed the fabric gate)",
            "record a run whose fabric gate passed (not a CPU rehearsal, not a run with the gate off)",
        )
    if len(measurement.tokens_per_s) < tb.MIN_MEASURED_STEPS:
        raise BaselineError(
            "steps",
            len(measurement.tokens_per_s),
            f"fewer than {tb.MIN_MEASURED_STEPS} steady steps (after {tb.WARMUP_STEPS} warm-up steps per process)",
            "record a longer run",
        )


def baseline_from(
    measurement: Measurement, *, env: str, group: GpuNodeGroupConfig, job: str, report: Path, commit: str, by: str
) -> tb.MeasuredBaseline:
    check(measurement, group, job=job)
    return tb.MeasuredBaseline(
        environment=env,
        group=group.name,
        job=job,
        tokens_per_s=statistics.median(measurement.tokens_per_s),
        steps=len(measurement.tokens_per_s),
        model=str(measurement.identity["model"]),
        instance_type=group.instance_type,
        node_count=group.workload_nodes,
        source=tb.Provenance(
            report=str(report),
            run_id=measurement.run_id,
            run_finished=_utc(measurement.finished),
            fabric_gate=str(measurement.fabric_gate),
            commit=commit,
            recorded_by=by,
            recorded_at=_utc(datetime.datetime.now(datetime.UTC).timestamp()),
        ),
    )


def _write(baselines: Sequence[tb.MeasuredBaseline]) -> None:
    text = tb.dumps(baselines)
    tb.parse(json.loads(text))  # the content validates before it replaces the file
    path = tb.BASELINES_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def record(
    *, env: str, group: str, job: str, report: Path, commit: str, by: str, replace_existing: bool
) -> tb.MeasuredBaseline:
    _, config = group_of(env, group)
    current = tb.load()
    baseline = baseline_from(measure(report), env=env, group=config, job=job, report=report, commit=commit, by=by)
    existing = [b for b in current if b.key == baseline.key]
    if existing and not replace_existing:
        raise BaselineError(
            f"{env}/{group}/{job}",
            existing[0].tokens_per_s,
            f"a baseline is recorded already ({existing[0].cited()})",
            "pass --replace to replace it, or `trainctl baseline reset` first",
        )
    _write([b for b in current if b.key != baseline.key] + [baseline])
    return baseline


def reset(*, env: str, group: str, job: str | None) -> list[tb.MeasuredBaseline]:
    current = tb.load()
    gone = [b for b in current if (b.environment, b.group) == (env, group) and job in (None, b.job)]
    if not gone:
        recorded = ", ".join("/".join(b.key) for b in current) or "none"
        raise BaselineError(
            "--job" if job else "--group",
            job or group,
            f"no baseline recorded for {env}/{group}{'/' + job if job else ''} (recorded: {recorded})",
            "see `trainctl baseline show`",
        )
    _write([b for b in current if b not in gone])
    return gone


def waiting() -> list[dict[str, str]]:
    """The GPU groups with no measured baseline: no throughput alarm until one is recorded."""
    measured = {(b.environment, b.group) for b in tb.load()}
    return [
        {"environment": env.name, "group": g.name, "instance_type": g.instance_type}
        for env in ENVIRONMENTS.values()
        for g in env.gpu_node_groups
        if (env.name, g.name) not in measured
    ]


def current_commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def current_user() -> str:
    return os.environ.get("USER") or os.environ.get("USERNAME") or "unknown"

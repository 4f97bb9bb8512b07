"""Where a job's wall time went (trainctl/commands/goodput.py is the command; its docstring defines the
causes): a Ledger per job from the NVRx journal (training/journal.py) or the Ray fine-tune's step
reports, each instant of the wall time given to exactly one cause by priority, and the Young/Daly
checkpoint interval.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.spec.instances import INSTANCE_TYPES
from infra.spec.operating import NODE_MTBF, OPERATING
from trainctl.save_throughput import SaveThroughput, measured_saves, render_saves
from training.journal import JOURNAL_FILE, Event, block_stops, summarize, verify_failures

CAUSES = (
    "productive",
    "startup",
    "checkpoint_stall",
    "fault_detection",
    "fault_recovery",
    "recomputed",
    "failed_checkpoint",
    "slow_steps",
    "finalize",
    "unattributed",
)
# Where intervals overlap the first listed wins.
PRIORITY = (
    "fault_detection",
    "recomputed",
    "failed_checkpoint",
    "checkpoint_stall",
    "slow_steps",
    "productive",
    "fault_recovery",
    "startup",
    "finalize",
)
DEFAULT_SLOW_FACTOR = 1.5


class GoodputError(ValueError):
    pass


@dataclass(frozen=True)
class Interval:
    cause: str
    start: float
    end: float


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    checkpoint_stall_s: float
    job_mtbf_s: float
    interval_s: float
    step_time_s: float
    every_steps: int
    mtbf_source: str


@dataclass(kw_only=True)
class Ledger:
    job: str
    kind: str
    wall_s: float
    seconds: dict[str, float]
    steps: int
    steps_lost: int
    baseline_step_s: float | None
    nodes: int
    gpus: int
    instance_type: str | None
    usd_per_node_hour: float | None
    recommendation: Recommendation | None
    intervals: list[Interval] = field(default_factory=list)
    save_throughput: SaveThroughput | None = None
    verify_failures: list[dict[str, Any]] = field(default_factory=list)
    block_stops: list[dict[str, Any]] = field(default_factory=list)

    def percent(self, cause: str) -> float:
        return 100.0 * self.seconds[cause] / self.wall_s if self.wall_s > 0 else 0.0

    def gpu_hours(self, cause: str) -> float:
        return self.seconds[cause] * self.gpus / 3600.0

    def cost(self, cause: str) -> float | None:
        if self.usd_per_node_hour is None:
            return None
        return self.seconds[cause] * self.nodes * self.usd_per_node_hour / 3600.0

    def as_json(self) -> dict[str, Any]:
        causes = {
            c: {
                "seconds": self.seconds[c],
                "percent": self.percent(c),
                "gpu_hours": self.gpu_hours(c),
                "usd": self.cost(c),
            }
            for c in CAUSES
        }
        return {
            "job": self.job,
            "kind": self.kind,
            "wall_s": self.wall_s,
            "sum_of_causes_s": sum(self.seconds.values()),
            "steps": self.steps,
            "steps_lost": self.steps_lost,
            "baseline_step_s": self.baseline_step_s,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "instance_type": self.instance_type,
            "usd_per_node_hour": self.usd_per_node_hour,
            "causes": causes,
            "checkpoint_interval": asdict(self.recommendation) if self.recommendation else None,
            "save_throughput": self.save_throughput.as_json() if self.save_throughput else None,
            "verify_failures": self.verify_failures,
            "block_stops": self.block_stops,
        }


def paint(intervals: Sequence[Interval], start: float, end: float) -> dict[str, float]:
    """Seconds per cause over [start, end]: each elementary segment goes to the highest-priority cause
    covering it, or to `unattributed`."""
    rank = {cause: i for i, cause in enumerate(PRIORITY)}
    clipped = [Interval(i.cause, max(i.start, start), min(i.end, end)) for i in intervals]
    clipped = [i for i in clipped if i.end > i.start]
    bounds = sorted({start, end, *(i.start for i in clipped), *(i.end for i in clipped)})
    seconds = dict.fromkeys(CAUSES, 0.0)
    for a, b in itertools.pairwise(bounds):
        middle = (a + b) / 2
        covering = [i.cause for i in clipped if i.start <= middle < i.end]
        cause = min(covering, key=rank.__getitem__) if covering else "unattributed"
        seconds[cause] += b - a
    return seconds


def _step_intervals(begin: float, end: float, baseline: float | None, factor: float, lost: bool) -> list[Interval]:
    if lost:
        return [Interval("recomputed", begin, end)]
    if baseline is not None and end - begin > factor * baseline:
        return [Interval("productive", begin, begin + baseline), Interval("slow_steps", begin + baseline, end)]
    return [Interval("productive", begin, end)]


def nvrx_ledger(
    events: list[dict[str, Any]], *, job: str, baseline_step_s: float | None, slow_factor: float
) -> tuple[list[Interval], float, float, int, int, list[float], int]:
    """Intervals, start, end, steps run, steps lost, checkpoint stalls and world size of an NVRx journal."""
    starts = [e for e in events if e["event"] == Event.START]
    if not starts:
        raise GoodputError(f"{job}: the journal has no start event (is it an NVRx metrics journal?)")

    def attempt(e: dict[str, Any]) -> tuple[str, int, int]:
        return (e["run_id"], e["restart"], e["iteration"])

    order: list[tuple[str, int, int]] = []
    for e in starts:
        if attempt(e) not in order:
            order.append(attempt(e))
    by_attempt: dict[tuple[str, int, int], list[dict[str, Any]]] = {a: [] for a in order}
    for e in events:
        key = attempt(e)
        if key in by_attempt:
            by_attempt[key].append(e)
    steps_all = [e for e in events if e["event"] == Event.STEP]
    median_step = statistics.median(e["seconds"] for e in steps_all) if steps_all else None
    baseline = baseline_step_s if baseline_step_s is not None else median_step

    def begin_of(index: int) -> float:
        mine = [e for e in by_attempt[order[index]] if e["event"] == Event.START]
        first_start = min(e["time"] for e in mine)
        processes = [e["process_start"] for e in mine if e.get("process_start") is not None]
        previous_end = None if index == 0 else max(e["time"] for e in by_attempt[order[index - 1]])
        fresh = [p for p in processes if previous_end is None or p >= previous_end]
        return float(min(fresh)) if fresh else float(first_start)

    begins = [begin_of(i) for i in range(len(order))]
    t0 = begins[0]
    t_end = max(e["time"] for e in events)
    intervals: list[Interval] = []
    steps_lost = 0
    for index, key in enumerate(order):
        mine = by_attempt[key]
        steps = [e for e in mine if e["event"] == Event.STEP]
        resumed_next = None
        if index + 1 < len(order):
            resumes = [e for e in by_attempt[order[index + 1]] if e["event"] == Event.RESUMED]
            resumed_next = resumes[0]["step"] if resumes else None
        first_step = min((e["time"] - e["seconds"] for e in steps), default=None)
        label = "startup" if index == 0 else "fault_recovery"
        attempt_end = max(e["time"] for e in mine)
        intervals.append(Interval(label, begins[index], first_step if first_step is not None else attempt_end))
        for e in steps:
            lost = resumed_next is not None and e["step"] > resumed_next
            steps_lost += lost
            intervals += _step_intervals(e["time"] - e["seconds"], e["time"], baseline, slow_factor, lost)
        failed = {e["step"] for e in mine if e["event"] == Event.VERIFY_FAILED}
        for e in mine:
            if e["event"] == Event.SAVE:
                # A save that failed its read-back was never published: its stall bought no protection.
                cause = "failed_checkpoint" if e["step"] in failed else "checkpoint_stall"
                intervals.append(Interval(cause, e["time"] - e["stall_s"], e["time"]))
        faults = [e for e in mine if e["event"] == Event.FAULT]
        if faults and index + 1 < len(order):
            intervals.append(Interval("fault_detection", min(f["time"] for f in faults), begins[index + 1]))
    last = by_attempt[order[-1]]
    activity = [e["time"] for e in last if e["event"] in (Event.STEP, Event.SAVE)]
    if activity:
        intervals.append(Interval("finalize", max(activity), t_end))
    stalls = [s["stall_s"] for s in summarize(events)["saves"]]
    world_size = len({e["rank"] for e in starts})
    return intervals, t0, t_end, len(steps_all), steps_lost, stalls, world_size


def ray_ledger(
    reports: list[dict[str, Any]], *, job: str, baseline_step_s: float | None, slow_factor: float
) -> tuple[list[Interval], float, float, int]:
    steps = [r for r in reports if "step_time_s" in r and not r.get("final")]
    if not steps or any("time" not in r for r in steps):
        raise GoodputError(f"{job}: no step reports with wall-clock times (`time`): rerun with this platform's trainer")
    median_step = statistics.median(r["step_time_s"] for r in steps)
    baseline = baseline_step_s if baseline_step_s is not None else median_step
    firsts = [r["time"] - r["step_time_s"] for r in steps]
    processes = [r["process_start"] for r in steps if r.get("process_start") is not None]
    t0 = min(processes) if processes else min(firsts)
    t_end = max(r["time"] for r in steps)
    intervals = [Interval("startup", t0, min(firsts))]
    for r in steps:
        intervals += _step_intervals(r["time"] - r["step_time_s"], r["time"], baseline, slow_factor, False)
    return intervals, t0, t_end, len(steps)


def recommend(stalls: list[float], step_time_s: float | None, nodes: int) -> Recommendation | None:
    if not stalls or step_time_s is None or step_time_s <= 0:
        return None
    stall = statistics.median(stalls)
    if stall <= 0:
        return None
    mtbf = NODE_MTBF.job_mtbf_s(nodes)
    interval = NODE_MTBF.checkpoint_interval_s(checkpoint_stall_s=stall, nodes=nodes)
    return Recommendation(
        checkpoint_stall_s=stall,
        job_mtbf_s=mtbf,
        interval_s=interval,
        step_time_s=step_time_s,
        every_steps=max(1, round(interval / step_time_s)),
        mtbf_source=NODE_MTBF.source,
    )


def read_records(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """('nvrx', journal events) or ('ray', step reports) from a file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GoodputError(f"{path}: cannot read ({exc.strerror})") from None
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" not in stripped.strip():
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise GoodputError(f"{path}: not JSON ({exc})") from None
        if isinstance(document, dict) and isinstance(document.get("history"), list):
            return "ray", document["history"]
        raise GoodputError(f"{path}: a JSON document without `history`: pass a journal.jsonl or a Ray --output-json")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise GoodputError(f"{path}:{number}: not a JSON line") from None
    if any("event" in r for r in records):
        return "nvrx", sorted(records, key=lambda e: float(e["time"]))
    return "ray", records


def ledger_for(
    path: Path,
    *,
    instance_type: str | None,
    nodes: int | None,
    baseline_step_s: float | None = None,
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    environment: str | None = None,
) -> Ledger:
    kind, records = read_records(path)
    job = path.parent.name if path.name == JOURNAL_FILE else path.stem
    stalls: list[float] = []
    steps_lost = 0
    world_size = 1
    if kind == "nvrx":
        intervals, t0, t_end, steps, steps_lost, stalls, world_size = nvrx_ledger(
            records, job=job, baseline_step_s=baseline_step_s, slow_factor=slow_factor
        )
        step_times = [r["seconds"] for r in records if r["event"] == Event.STEP]
    else:
        intervals, t0, t_end, steps = ray_ledger(
            records, job=job, baseline_step_s=baseline_step_s, slow_factor=slow_factor
        )
        step_times = [r["step_time_s"] for r in records if "step_time_s" in r]
    spec = INSTANCE_TYPES.get(instance_type) if instance_type else None
    if instance_type is not None and spec is None:
        raise GoodputError(f"--instance-type {instance_type!r} is not one of {sorted(INSTANCE_TYPES)}")
    gpus_per_node = spec.gpu.count if spec is not None and spec.gpu is not None else None
    node_count = nodes or (max(1, math.ceil(world_size / gpus_per_node)) if gpus_per_node else 1)
    gpus = node_count * gpus_per_node if gpus_per_node else world_size
    facts = OPERATING.get(instance_type) if instance_type else None
    median_step = statistics.median(step_times) if step_times else None
    return Ledger(
        job=job,
        kind=kind,
        wall_s=t_end - t0,
        seconds=paint(intervals, t0, t_end),
        steps=steps,
        steps_lost=steps_lost,
        baseline_step_s=baseline_step_s if baseline_step_s is not None else median_step,
        nodes=node_count,
        gpus=gpus,
        instance_type=instance_type,
        usd_per_node_hour=facts.on_demand_usd_per_hour if facts else None,
        recommendation=recommend(stalls, median_step, node_count),
        intervals=intervals,
        save_throughput=measured_saves(records, environment) if kind == "nvrx" else None,
        verify_failures=verify_failures(records) if kind == "nvrx" else [],
        block_stops=block_stops(records) if kind == "nvrx" else [],
    )


def render(ledger: Ledger) -> str:
    lines = [
        f"{ledger.job} ({ledger.kind}): wall {ledger.wall_s:.2f} s, {ledger.steps} step executions, "
        f"{ledger.steps_lost} lost, {ledger.nodes} node(s), {ledger.gpus} GPU(s)"
        + (f", {ledger.instance_type} at ${ledger.usd_per_node_hour}/h" if ledger.usd_per_node_hour else ""),
        f"  {'cause':<18}{'seconds':>10}{'%':>8}{'GPU-h':>10}{'USD':>10}",
    ]
    for cause in CAUSES:
        cost = ledger.cost(cause)
        lines.append(
            f"  {cause:<18}{ledger.seconds[cause]:>10.2f}{ledger.percent(cause):>8.1f}"
            f"{ledger.gpu_hours(cause):>10.4f}{'n/a' if cost is None else f'{cost:.4f}':>10}"
        )
    failures = ledger.verify_failures
    if failures:
        each = ", ".join(f"step {f['step']} ({f['reason']}, {f['exposed_steps']} steps unprotected)" for f in failures)
        lines.append(f"  {len(failures)} save{'s' if len(failures) > 1 else ''} failed verification: {each}")
    for stop in ledger.block_stops:
        if stop["outcome"] == "refused":
            lines.append(f"  refused to start on a Capacity Block (stop point {stop['stop_at']}): {stop['why']}")
        else:
            lines.append(
                f"  stopped for a Capacity Block at step {stop['step']} (stop point {stop['stop_at']}); the next "
                f"capacity resumes from step {stop['resumes_from']} ({stop['unsaved_steps']} steps unsaved)"
            )
    rec = ledger.recommendation
    if rec is not None:
        lines.append(
            f"  checkpoint interval (Young-Daly): sqrt(2 x {rec.checkpoint_stall_s:.3f} s x {rec.job_mtbf_s:.0f} s) = "
            f"{rec.interval_s:.0f} s = every {rec.every_steps} steps at {rec.step_time_s:.3f} s/step "
            f"(NvrxFsdpJob(checkpoint=CheckpointPolicy(every_steps={rec.every_steps})) in k8s/nvrx_spec.py)"
        )
    if ledger.save_throughput is not None:
        lines.append(render_saves(ledger.save_throughput))
    return "\n".join(lines)


def chart(ledgers: Sequence[Ledger], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(ledgers)))
    for row, ledger in enumerate(ledgers):
        left = 0.0
        for index, cause in enumerate(CAUSES):
            width = ledger.percent(cause)
            ax.barh(row, width, left=left, color=f"C{index}", label=cause if row == 0 else None)
            left += width
    ax.set_yticks(range(len(ledgers)), [ledger.job for ledger in ledgers])
    ax.set_xlabel("% of wall time")
    ax.legend(ncol=3, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

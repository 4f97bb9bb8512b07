"""The NVRx job's journal: JSON lines appended to CKPT_DIR/journal.jsonl by every process of every attempt
(training/nvrx_fsdp.py writes it; trainctl goodput and the job's own metrics read it). The event names are
defined here once, for the writer and the readers. Standard library only: it ships to the pods in the
training-code ConfigMap (k8s/charts/ray.py) and trainctl imports it without torch.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

JOURNAL_FILE = "journal.jsonl"


class Event(StrEnum):
    """The `event` field of a journal line."""

    START = "start"
    """A process began (rank, pid, process_start); one per rank per attempt and in-process iteration."""
    RESUMED = "resumed"
    """Rank 0 loaded the newest verified checkpoint (step, ignored_incomplete; chosen_because: why that one,
    skipped: each newer step directory passed over and why)."""
    STEP = "step"
    """Rank 0 finished a step (step, seconds, loss)."""
    SAVE = "save"
    """Rank 0 started a checkpoint save (step, saver, stall_s: how long it blocked training)."""
    STAGED = "staged"
    """The next optimizer step waited for that save's copy of the state to end (step, wait_s)."""
    VERIFIED = "verified"
    """A save read back as written on every rank, and its metadata loaded (step, verify_s, files, bytes)."""
    VERIFY_FAILED = "verify_failed"
    """A save did not read back; it was renamed aside, never published (step, reason, detail, quarantined_to,
    verify_s)."""
    COMMIT = "commit"
    """A verified save was published: its COMMITTED marker written (step, stall_s, commit_wait_s, and
    commit_fields: bytes, write_s, the write's end taken before its read-back)."""
    FAULT = "fault"
    """An injected fault fired (fault, step, completed_steps, last_committed, files)."""
    FINISHED = "finished"
    """Rank 0 reached the last step (step, loss)."""
    BLOCK_STOP = "block_stop"
    """Rank 0 ended the run for a Capacity Block (training/deadline.py): outcome `stopped` (step: the last completed
    step, saved) or `refused` (not started: the first checkpoint could not be reached); resumes_from: the step the
    next capacity resumes from; stop_at; why."""


class Journal:
    """JSON lines appended to DIR/journal.jsonl by every process of every attempt: what the metrics are built from,
    since a killed process keeps nothing in memory. Each event is one O_APPEND write, so lines do not interleave."""

    def __init__(self, path: Path, rank: int, context: dict[str, Any]) -> None:
        self.path = path
        self.rank = rank
        self.context = context

    def event(self, kind: Event, **fields: Any) -> None:
        record = {
            "event": kind.value,
            "time": time.time(),
            "rank": self.rank,
            "pid": os.getpid(),
            **self.context,
            **fields,
        }
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def commit_fields(directory: Path, *, started_at: float, committed_at: float) -> dict[str, Any]:
    """A commit event's size and duration: the bytes of every file in the step's directory (all ranks' shards, on
    the shared file system) and the seconds from the save's start to its commit. The commit is noticed at the next
    step's poll, so bytes / write_s is at most the write's real throughput (trainctl goodput reports it)."""
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return {"bytes": size, "write_s": committed_at - started_at}


def read_journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(events, key=lambda e: float(e["time"]))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _restart_kind(fault: dict[str, Any], resumed: dict[str, Any]) -> str:
    if resumed["run_id"] != fault["run_id"]:
        return "relaunch"
    if resumed["restart"] > fault["restart"]:
        return "ft_launcher"
    if resumed["iteration"] > fault["iteration"]:
        return "inprocess"
    return "unknown"


def verify_failures(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each save that failed its read-back, with what it cost: the stall of a save that protects nothing, and the
    steps it should have protected (since the newest verified save before it) that a fault would now lose."""
    context = ("run_id", "restart", "iteration")
    stalls: dict[tuple[Any, ...], float] = {}
    for e in events:
        key = tuple(e.get(k) for k in (*context, "step"))
        if e["event"] == Event.SAVE:
            stalls[key] = stalls.get(key, 0.0) + float(e["stall_s"])
        elif e["event"] == Event.STAGED:
            stalls[key] = stalls.get(key, 0.0) + float(e["wait_s"])
    out, protected = [], 0
    for e in events:
        if e["event"] == Event.RESUMED:
            protected = int(e["step"])
        elif e["event"] == Event.VERIFIED:
            protected = max(protected, int(e["step"]))
        elif e["event"] == Event.VERIFY_FAILED:
            key = tuple(e.get(k) for k in (*context, "step"))
            out.append(
                {
                    **{k: e.get(k) for k in ("step", "reason", "detail", "verify_s", "quarantined_to")},
                    "stall_s": stalls.get(key, 0.0),
                    "exposed_steps": int(e["step"]) - protected,
                    **{k: e[k] for k in context},
                }
            )
    return out


def block_stops(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each end of a run for a Capacity Block, with the steps it left unsaved (step - resumes_from)."""
    return [
        {
            **{k: e.get(k) for k in ("outcome", "step", "resumes_from", "stop_at", "why", "run_id")},
            "unsaved_steps": int(e["step"]) - int(e["resumes_from"]),
        }
        for e in events
        if e["event"] == Event.BLOCK_STOP
    ]


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step times, saves, restarts and recoveries of the whole job, from its journal."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_kind.setdefault(event["event"], []).append(event)
    context = ("run_id", "restart", "iteration")
    steps = [{k: e[k] for k in ("step", "seconds", "loss", *context)} for e in by_kind.get(Event.STEP, [])]
    committed = {(e["run_id"], e["restart"], e["iteration"], e["step"]) for e in by_kind.get(Event.COMMIT, [])}
    staged = {
        (e["run_id"], e["restart"], e["iteration"], e["step"]): e["wait_s"] for e in by_kind.get(Event.STAGED, [])
    }
    verified = {(e["run_id"], e["restart"], e["iteration"], e["step"]) for e in by_kind.get(Event.VERIFIED, [])}
    failed = {(e["run_id"], e["restart"], e["iteration"], e["step"]): e for e in by_kind.get(Event.VERIFY_FAILED, [])}
    saves = []
    for e in by_kind.get(Event.SAVE, []):
        key = (e["run_id"], e["restart"], e["iteration"], e["step"])
        # The step loop was blocked while save() ran and again while the next optimizer step waited for the copy.
        saves.append(
            {
                **{k: e[k] for k in ("step", "saver", *context)},
                "stall_s": e["stall_s"] + staged.get(key, 0.0),
                "committed": key in committed,
                "verified": key in verified,
                "verify_failed": failed[key]["reason"] if key in failed else None,
            }
        )
    resumes = by_kind.get(Event.RESUMED, [])
    recoveries = []
    for fault in by_kind.get(Event.FAULT, []):
        entry: dict[str, Any] = {
            k: fault[k] for k in ("fault", "step", "rank", "completed_steps", "last_committed", *context)
        }
        entry["files_at_fault"] = fault.get("files", [])
        since_checkpoint = fault["completed_steps"] - (fault["last_committed"] or 0)
        entry["steps_since_checkpoint"] = since_checkpoint
        resumed = next((r for r in resumes if r["time"] > fault["time"]), None)
        if resumed is not None:
            entry.update(
                resumed_step=resumed["step"],
                steps_lost=fault["completed_steps"] - resumed["step"],
                recovery_s=resumed["time"] - fault["time"],
                recovered_by=_restart_kind(fault, resumed),
            )
        recoveries.append(entry)
    starts = [{k: e[k] for k in ("rank", "pid", "time", *context)} for e in by_kind.get(Event.START, [])]
    resumed_fields = ("step", "ignored_incomplete", "time", *context)
    stalls = [s["stall_s"] for s in saves]
    return {
        "step_times": steps,
        "saves": saves,
        "save_stall_s": {"count": len(stalls), "median": _median(stalls), "max": max(stalls, default=None)},
        "recoveries": recoveries,
        "resumes": [
            {
                **{k: r[k] for k in resumed_fields},
                "chosen_because": r.get("chosen_because"),
                "skipped": r.get("skipped"),
            }
            for r in resumes
        ],
        "verify_failures": verify_failures(events),
        "starts": starts,
        "restarts": {
            "torchelastic": max((s["restart"] for s in starts), default=0),
            "inprocess_iterations": max((s["iteration"] for s in starts), default=0),
            "launches": len({s["run_id"] for s in starts}),
        },
    }

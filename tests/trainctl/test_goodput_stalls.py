"""The checkpoint stall `trainctl goodput` recommends an interval from is the one the journal's summary reports:
save() blocking the loop plus the next optimizer step waiting for the staged copy (training/journal.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainctl.goodput import ledger_for
from training.journal import read_journal, summarize


def _journal(path: Path) -> Path:
    ctx = {"run_id": "r", "restart": 0, "iteration": 0, "rank": 0, "pid": 1}
    events = [{"event": "start", "time": 100.0, "process_start": 99.0, **ctx}]
    t = 101.0
    for step in range(1, 7):
        t += 0.5
        events.append({"event": "step", "time": t, "step": step, "seconds": 0.5, "loss": 1.0, **ctx})
        if step % 2 == 0:
            t += 0.2
            events.append({"event": "save", "time": t, "step": step, "saver": "async", "stall_s": 0.2, **ctx})
            events.append({"event": "staged", "time": t + 0.01, "step": step, "wait_s": 0.3, **ctx})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_recommended_stall_counts_the_wait_for_the_staged_copy(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal.jsonl")
    rec = ledger_for(journal, instance_type="p5.48xlarge", nodes=2).recommendation
    assert rec is not None
    assert rec.checkpoint_stall_s == pytest.approx(0.5)
    assert rec.checkpoint_stall_s == pytest.approx(summarize(read_journal(journal))["save_stall_s"]["median"])

"""A save that failed its read-back (training/ckpt_verify.py) in `trainctl goodput` and the journal's summary:
counted, its stall booked as a failed checkpoint, and the steps it left unprotected named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainctl.goodput import ledger_for, render
from training.journal import Event, summarize


def _journal(path: Path) -> list[dict[str, Any]]:
    """Steps 1-6 saving every 2; the step-4 save fails verification; rank 1 is killed at step 6 and the job
    resumes from step 2, the newest verified checkpoint."""
    first = {"run_id": "r", "restart": 0, "iteration": 0, "rank": 0, "pid": 1}
    second = {**first, "restart": 1, "pid": 2}
    events: list[dict[str, Any]] = [{"event": Event.START, "time": 100.0, "process_start": 99.0, **first}]
    t = 100.0
    for step in range(1, 6):
        t += 1.0
        events.append({"event": Event.STEP, "time": t, "step": step, "seconds": 1.0, "loss": 1.0, **first})
        if step % 2 == 0:
            t += 0.25
            events.append(
                {"event": Event.SAVE, "time": t, "step": step, "saver": "torch-async", "stall_s": 0.25, **first}
            )
            if step == 2:
                events.append({"event": Event.VERIFIED, "time": t + 0.5, "step": 2, "verify_s": 0.1, **first})
                events.append(
                    {"event": Event.COMMIT, "time": t + 0.5, "step": 2, "stall_s": 0.25, "commit_wait_s": 0, **first}
                )
            else:
                events.append(
                    {
                        **{"event": Event.VERIFY_FAILED, "time": t + 0.5, "step": 4, "reason": "hash-mismatch"},
                        **{"detail": "rank 0: __0_0.distcp", "verify_s": 0.1, **first},
                        "quarantined_to": "quarantine/step_000000004.hash-mismatch",
                    }
                )
    events.append(
        {
            **{"event": Event.FAULT, "time": t + 0.1, "fault": "kill", "step": 6, "completed_steps": 5},
            **{"last_committed": 2, "files": [], **first, "rank": 1},
        }
    )
    events.append({"event": Event.START, "time": t + 5, "process_start": t + 4, **second})
    events.append(
        {
            **{"event": Event.RESUMED, "time": t + 6, "step": 2, "ignored_incomplete": [], **second},
            "chosen_because": "step 2 is the newest checkpoint whose read-back verified",
            "skipped": ["step 4: quarantined as quarantine/step_000000004.hash-mismatch"],
        }
    )
    events.append({"event": Event.STEP, "time": t + 7, "step": 3, "seconds": 1.0, "loss": 1.0, **second})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return events


def test_the_summary_marks_the_failed_save_and_the_resume_says_why(tmp_path: Path) -> None:
    summary = summarize(_journal(tmp_path / "journal.jsonl"))
    assert [(s["step"], s["committed"], s["verified"], s["verify_failed"]) for s in summary["saves"]] == [
        (2, True, True, None),
        (4, False, False, "hash-mismatch"),
    ]
    assert summary["verify_failures"] == [
        {
            **{"step": 4, "reason": "hash-mismatch", "detail": "rank 0: __0_0.distcp", "verify_s": 0.1},
            **{"quarantined_to": "quarantine/step_000000004.hash-mismatch", "stall_s": 0.25, "exposed_steps": 2},
            **{"run_id": "r", "restart": 0, "iteration": 0},
        }
    ]
    (resumed,) = summary["resumes"]
    assert resumed["chosen_because"] == "step 2 is the newest checkpoint whose read-back verified"
    assert resumed["skipped"] == ["step 4: quarantined as quarantine/step_000000004.hash-mismatch"]


def test_goodput_books_the_failed_saves_stall_and_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _journal(path)
    ledger = ledger_for(path, instance_type=None, nodes=1)
    assert ledger.seconds["failed_checkpoint"] == pytest.approx(0.25)
    assert ledger.seconds["checkpoint_stall"] == pytest.approx(0.25), "the verified save's stall only"
    assert [(f["step"], f["reason"], f["exposed_steps"]) for f in ledger.verify_failures] == [(4, "hash-mismatch", 2)]
    assert ledger.as_json()["verify_failures"] == ledger.verify_failures
    assert "1 save failed verification: step 4 (hash-mismatch, 2 steps unprotected)" in render(ledger)

"""`trainctl goodput` reports the measured save throughput (the journal's commit events: bytes, write_s) against the
environment's file-system figure (infra/spec/checkpoint_throughput.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainctl.cli import main
from trainctl.goodput import ledger_for
from training.journal import commit_fields


def _journal(path: Path, *, with_bytes: bool = True) -> Path:
    ctx = {"run_id": "r", "restart": 0, "iteration": 0, "rank": 0, "pid": 1}
    events = [{"event": "start", "time": 100.0, "process_start": 99.0, **ctx}]
    t = 101.0
    # Three saves of 18.5 GB written in 200, 185 and 250 s: 92.6, 100.1 and 74.1 MB/s.
    for step, write_s in ((10, 200.0), (20, 185.0), (30, 250.0)):
        t += 1.0
        events.append({"event": "step", "time": t, "step": step, "seconds": 1.0, "loss": 1.0, **ctx})
        events.append({"event": "save", "time": t, "step": step, "saver": "torch-async", "stall_s": 0.1, **ctx})
        extra = {"bytes": 18_524_571_648, "write_s": write_s} if with_bytes else {}
        t += 1.0
        events.append(
            {"event": "commit", "time": t, "step": step, "stall_s": 0.1, "commit_wait_s": 0.0, **extra, **ctx}
        )
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_measured_throughput_is_compared_with_the_environments_figure(tmp_path: Path) -> None:
    ledger = ledger_for(_journal(tmp_path / "journal.jsonl"), instance_type=None, nodes=2, environment="dev")
    saves = ledger.save_throughput
    assert saves is not None
    assert saves.saves == 3
    assert saves.median_mb_s == pytest.approx(18_524.571648 / 200.0)
    assert saves.min_mb_s == pytest.approx(18_524.571648 / 250.0)
    # dev: SCRATCH_2, 1200 GiB x 100 MB/s/TiB write baseline.
    assert saves.spec_mb_s == pytest.approx(117.1875)
    assert saves.percent_of_spec == pytest.approx(100 * 92.6228 / 117.1875, rel=1e-4)


def test_the_cli_prints_it_and_without_env_the_figure_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = _journal(tmp_path / "journal.jsonl")
    assert main(["goodput", str(journal), "--env", "dev"]) == 0
    out = capsys.readouterr().out
    assert "save throughput: median 92.6 MB/s" in out
    assert "dev's file system: 117.2 MB/s (SCRATCH_2, 1,200 GiB x 100 MB/s/TiB" in out
    assert main(["goodput", str(journal), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    (job,) = document["jobs"]
    assert job["save_throughput"]["median_mb_s"] == pytest.approx(92.6228, rel=1e-4)
    assert job["save_throughput"]["spec_mb_s"] is None


def test_a_journal_without_save_sizes_reports_none(tmp_path: Path) -> None:
    ledger = ledger_for(_journal(tmp_path / "journal.jsonl", with_bytes=False), instance_type=None, nodes=2)
    assert ledger.save_throughput is None


def test_the_commit_fields_are_the_step_directorys_bytes_and_the_write_time(tmp_path: Path) -> None:
    directory = tmp_path / "step_000000010"
    (directory / "sub").mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"x" * 1000)
    (directory / "sub" / "extra").write_bytes(b"y" * 24)
    assert commit_fields(directory, started_at=10.0, committed_at=12.5) == {"bytes": 1024, "write_s": 2.5}

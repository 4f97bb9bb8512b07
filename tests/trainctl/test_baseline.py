"""`trainctl baseline record/reset/show`: a measured throughput becomes a GPU group's too-slow alarm (issue 37).

The reports are small synthetic ones in the formats the jobs write (training/journal.py, the Ray fine-tune's
--output-json); the baseline file is a copy in tmp_path (infra/spec/throughput_baselines.py BASELINES_FILE)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.spec import throughput_baselines
from trainctl import baselines as baselines_lib
from trainctl.cli import main
from training import emf

TOKENS = 65536
P5 = {"job_name": "nvrx-fsdp", "model": "Qwen/Qwen2.5-1.5B", "instance_type": "p5.48xlarge", "node_count": 2}
G6 = {"job_name": "qwen-finetune", "model": "Qwen/Qwen2.5-1.5B", "instance_type": "g6.12xlarge", "node_count": 2}


@pytest.fixture
def baselines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "throughput_baselines.json"
    path.write_text(throughput_baselines.BASELINES_FILE.read_text())
    monkeypatch.setattr(throughput_baselines, "BASELINES_FILE", path)
    return path


def journal(tmp_path: Path, *, seconds: list[float], gate: str | None = "PASS", **identity: Any) -> Path:
    """An NVRx journal: rank 0's and rank 1's start, then rank 0's steps (warm-up first)."""
    ctx = {"run_id": "ft-run-7", "restart": 0, "iteration": 0}
    fields = {**P5, **identity}
    events: list[dict[str, Any]] = [
        {"event": "start", "time": 100.0, "rank": 0, "process_start": 90.0, "fabric_gate": gate, **fields, **ctx},
        {"event": "start", "time": 100.0, "rank": 1, "process_start": 90.0, **ctx},
    ]
    now = 100.0
    for step, s in enumerate(seconds, 1):
        now += s
        events.append({"event": "step", "time": now, "rank": 0, "step": step, "seconds": s, "loss": 2.0, **ctx})
        events[-1]["tokens"] = TOKENS
    path = tmp_path / "nvrx-fsdp" / "journal.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


# 5 warm-up steps, then 24 at 131,072 tokens/s and 26 at 163,840: the median of the steady steps is 163,840; with
# the warm-up counted it would be 131,072.
STEADY = [10.0] * 5 + [0.5] * 24 + [0.4] * 26


def record(*extra: str, env: str = "prod", group: str = "p5", job: str = "nvrx-fsdp") -> int:
    return main(
        [
            "baseline",
            "record",
            "--env",
            env,
            "--group",
            group,
            "--job",
            job,
            "--commit",
            "0123abc",
            "--by",
            "ops",
            *extra,
        ]
    )


def test_record_writes_the_median_of_the_steady_steps_with_its_provenance(tmp_path: Path, baselines: Path) -> None:
    report = journal(tmp_path, seconds=STEADY)
    assert record(str(report)) == 0
    (entry,) = json.loads(baselines.read_text())["baselines"]
    assert (entry["environment"], entry["group"]) == ("prod", "p5")
    assert entry["job"] == "nvrx-fsdp"
    assert entry["tokens_per_s"] == pytest.approx(TOKENS / 0.4)
    assert (entry["steps"], entry["instance_type"], entry["node_count"]) == (50, "p5.48xlarge", 2)
    source = entry["source"]
    assert source["report"] == str(report)
    assert source["run_id"] == "ft-run-7"
    assert (source["commit"], source["recorded_by"], source["fabric_gate"]) == ("0123abc", "ops", "PASS")
    assert source["run_finished"].startswith("1970-01-01T00:")
    (loaded,) = throughput_baselines.load()
    assert loaded.alarm_tokens_per_s == pytest.approx(0.8 * TOKENS / 0.4)


def test_record_reads_the_ray_fine_tunes_output_json(tmp_path: Path, baselines: Path) -> None:
    history = [
        {"step": i, "step_time_s": 2.0, "tokens_per_s": 16000.0 + i, "time": 1000.0 + 2 * i, "process_start": 990.0}
        | {"fabric_gate": "PASS", **G6}
        for i in range(1, 61)
    ]
    report = tmp_path / "ray-result.json"
    report.write_text(json.dumps({"metrics": {}, "checkpoint_path": None, "history": history}))
    assert record(str(report), env="dev", group="g6", job="qwen-finetune") == 0
    (entry,) = json.loads(baselines.read_text())["baselines"]
    # Steps 6..60 (after 5 warm-up steps): the median is step 33's.
    assert entry["tokens_per_s"] == pytest.approx(16033.0)
    assert entry["source"]["run_id"] is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"gate": "NOT RUN"}, "fabric_gate"),
        ({"gate": None}, "fabric_gate"),
        ({"seconds": [0.5] * 30}, "steps"),
        ({"instance_type": "g6.12xlarge"}, "instance_type"),
        ({"node_count": 1}, "node_count"),
        ({"job_name": "other-job"}, "job"),
    ],
)
def test_a_run_that_cannot_be_a_baseline_is_refused_and_the_file_is_unchanged(
    tmp_path: Path, baselines: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], named: str
) -> None:
    before = baselines.read_text()
    report = journal(tmp_path, **{"seconds": STEADY, **change})
    assert record(str(report)) == 2
    err = capsys.readouterr().err
    assert named in err
    assert "Fix:" in err
    assert baselines.read_text() == before


def test_bad_input_is_refused_with_the_field(
    tmp_path: Path, baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = baselines.read_text()
    report = journal(tmp_path, seconds=STEADY)
    assert record(str(report), group="nope") == 2
    assert "group" in capsys.readouterr().err
    assert record(str(tmp_path / "missing.jsonl")) == 2
    assert main(["baseline", "reset", "--env", "prod", "--group", "p5"]) == 2, "nothing recorded: nothing to reset"
    assert "Fix:" in capsys.readouterr().err
    assert baselines.read_text() == before


def test_reset_removes_and_a_second_record_needs_replace(
    tmp_path: Path, baselines: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = journal(tmp_path, seconds=STEADY)
    assert record(str(report)) == 0
    assert record(str(report)) == 2, "a recorded baseline is not overwritten silently"
    assert "--replace" in capsys.readouterr().err
    assert record(str(report), "--replace") == 0
    capsys.readouterr()
    assert main(["baseline", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(b["environment"], b["group"], b["job"]) for b in shown["baselines"]] == [("prod", "p5", "nvrx-fsdp")]
    assert ("dev", "g6") in {(w["environment"], w["group"]) for w in shown["waiting"]}
    assert main(["baseline", "reset", "--env", "prod", "--group", "p5", "--job", "nvrx-fsdp"]) == 0
    assert json.loads(baselines.read_text())["baselines"] == []


def test_the_reader_reads_the_fields_the_jobs_write() -> None:
    """The jobs write their identity with training/emf.py report_fields; trainctl/baselines.py reads those keys."""
    identity = emf.JobIdentity(job_name="nvrx-fsdp", model="m", instance_type="p5.48xlarge", node_count=2)
    assert tuple(identity.report_fields()) == baselines_lib.IDENTITY
    assert identity.report_fields()["node_count"] == 2


def test_a_garbled_report_is_refused(tmp_path: Path, baselines: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = journal(tmp_path, seconds=[0.0] * 60)
    assert record(str(report)) == 2
    assert "unedited" in capsys.readouterr().err

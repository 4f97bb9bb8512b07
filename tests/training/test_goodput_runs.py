"""`trainctl goodput` on the journals of the real NVRx fault runs (session fixtures of conftest.py: the
same processes test_nvrx_fsdp.py checks), and on the Ray fine-tune's report log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from infra.spec.operating import NODE_MTBF
from tests.training.nvrx_runs import NvrxRun
from trainctl.cli import main
from trainctl.goodput import CAUSES, ledger_for
from training.journal import read_journal, summarize

pytestmark = pytest.mark.timeout(600)

FAULT_RUNS = ["nvrx_sigkill", "nvrx_exception", "nvrx_hang", "nvrx_kill_during_save"]


@pytest.mark.parametrize("fixture", ["nvrx_reference", *FAULT_RUNS])
def test_causes_partition_the_wall_time(fixture: str, request: pytest.FixtureRequest) -> None:
    run: NvrxRun = request.getfixturevalue(fixture)
    ledger = ledger_for(run.journal, instance_type=None, nodes=1)
    total = sum(ledger.seconds[c] for c in CAUSES)
    assert total == pytest.approx(ledger.wall_s, rel=0.01)
    # The journal explains the run: what no interval covers (loop bookkeeping, journal writes) stays small.
    assert ledger.seconds["unattributed"] < 0.05 * ledger.wall_s, ledger.as_json()
    assert ledger.seconds["startup"] > 0, "process start to first step: imports, model load, sharding"
    assert ledger.seconds["productive"] > 0
    # The wall time starts at the first process start recorded by /proc, before the first journal event.
    first_event = min(e["time"] for e in read_journal(run.journal))
    starts = [e["process_start"] for e in read_journal(run.journal) if e["event"] == "start"]
    assert min(starts) < first_event


def test_the_journal_names_its_job_and_gate_and_each_steps_tokens(nvrx_reference: NvrxRun) -> None:
    """What `trainctl baseline record` reads (trainctl/baselines.py): rank 0's start names the job and the fabric
    gate's outcome (off or NOT RUN on CPU, which the record refuses), each step its tokens."""
    events = read_journal(nvrx_reference.journal)
    starts = [e for e in events if e["event"] == "start" and e["rank"] == 0]
    assert starts
    for start in starts:
        assert {"job_name", "model", "instance_type", "node_count", "fabric_gate"} <= set(start)
        assert start["fabric_gate"] in (None, "NOT RUN")
    assert all(e["tokens"] > 0 for e in events if e["event"] == "step")


@pytest.mark.parametrize("fixture", FAULT_RUNS)
def test_recomputed_steps_are_the_steps_lost(fixture: str, request: pytest.FixtureRequest) -> None:
    run: NvrxRun = request.getfixturevalue(fixture)
    ledger = ledger_for(run.journal, instance_type=None, nodes=1)
    lost = sum(r["steps_lost"] for r in summarize(read_journal(run.journal))["recoveries"])
    assert ledger.steps_lost == lost
    assert (ledger.seconds["recomputed"] > 0) == (lost > 0)
    assert ledger.seconds["fault_detection"] > 0
    assert ledger.seconds["fault_recovery"] > 0


def test_a_hang_costs_at_least_the_heartbeat_timeout(nvrx_hang: NvrxRun) -> None:
    ledger = ledger_for(nvrx_hang.journal, instance_type=None, nodes=1)
    assert ledger.seconds["fault_detection"] > 5, "the 5 s heartbeat timeout must pass before a restart"


def test_interval_recommendation_is_young_daly(nvrx_kill_during_save: NvrxRun) -> None:
    ledger = ledger_for(nvrx_kill_during_save.journal, instance_type="p5.48xlarge", nodes=2)
    rec = ledger.recommendation
    assert rec is not None
    stalls = sorted(s["stall_s"] for s in summarize(read_journal(nvrx_kill_during_save.journal))["saves"])
    assert rec.checkpoint_stall_s == pytest.approx(
        summarize(read_journal(nvrx_kill_during_save.journal))["save_stall_s"]["median"]
    )
    assert rec.job_mtbf_s == pytest.approx(NODE_MTBF.mtbf_node_hours * 3600 / 2)
    assert rec.interval_s == pytest.approx(math.sqrt(2 * rec.checkpoint_stall_s * rec.job_mtbf_s))
    assert rec.every_steps == max(1, round(rec.interval_s / rec.step_time_s))
    assert stalls


def test_cli_json_gpu_hours_cost_and_chart(
    nvrx_sigkill: NvrxRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "goodput.png"
    code = main(
        [
            "goodput",
            str(nvrx_sigkill.journal),
            "--instance-type",
            "g6.12xlarge",
            "--nodes",
            "2",
            "--json",
            "--chart",
            str(chart),
        ]
    )
    assert code == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["gpus"] == 8
    assert job["sum_of_causes_s"] == pytest.approx(job["wall_s"], rel=0.01)
    lost = job["causes"]["fault_detection"]
    assert lost["gpu_hours"] == pytest.approx(lost["seconds"] * 8 / 3600)
    assert lost["usd"] == pytest.approx(lost["seconds"] * 2 * 4.6016 / 3600)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_what_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"steps": 3}')
    assert main(["goodput", str(bad)]) == 2
    assert "without `history`" in capsys.readouterr().err
    assert main(["goodput", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["goodput", str(bad), "--instance-type", "x1.large"]) == 2

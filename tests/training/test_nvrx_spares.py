"""Hot spares with real processes: three ft_launcher "nodes" on loopback (rehearse/local_nodes.py), `--nnodes=2:3`, one
rank each over gloo, the tiny Qwen2; the active node that is not the store host is lost after a checkpoint, the standby
takes its rank within seconds and the job resumes from that checkpoint and completes; the lost node's replacement
joins as a standby and exits 0 with the others. The chart's side (the Job, --nnodes, GROUP_RANK):
tests/k8s/test_nvrx_spares.py.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rehearse.local_nodes import LocalNodes
from tests.image_envs import tool
from tests.tiers import starts_training_processes
from training.journal import read_journal

ROOT = Path(__file__).resolve().parents[2]
FT_LAUNCHER = tool("nvrx-train", "ft_launcher", str(Path(sys.executable).with_name("ft_launcher")))
STEPS = 30


@dataclass(frozen=True)
class SpareRun:
    lost: int
    standby: int
    lost_at: float
    committed_at_loss: int
    codes: dict[int, int | None]
    events: list[dict[str, Any]]
    metrics: dict[str, Any]
    logs: dict[int, str]


def _committed(events: list[dict[str, Any]]) -> int:
    return max((int(e["step"]) for e in events if e["event"] == "commit"), default=0)


@starts_training_processes
def lose_an_active_node_with_a_spare(out: Path, model_dir: Path) -> SpareRun:
    ckpt = out / "ckpt"
    training = [
        *("--model", str(model_dir), "--device", "cpu", "--seq-len", "32", "--batch-size", "2", "--seed", "7"),
        *("--steps", str(STEPS), "--ckpt-every", "2", "--ckpt-keep", "2", "--log-every", "1000"),
        # Paced so that the loss lands mid-run and the replacement has time to join before the end.
        *("--min-step-s", "0.5", "--ckpt-dir", str(ckpt), "--metrics-file", str(out / "metrics.json")),
    ]
    journal = ckpt / "journal.jsonl"
    with LocalNodes(FT_LAUNCHER, training, out / "logs", active=2, spares=1, cwd=ROOT, join_timeout_s=60) as nodes:
        nodes.start_all()
        deadline = time.monotonic() + 120
        while _committed(read_journal(journal)) < 4:
            assert time.monotonic() < deadline, "no checkpoint committed in 120 s:\n" + nodes.log(0)[-4000:]
            assert all(p.poll() is None for p in nodes.procs.values()), nodes.log(0)[-4000:]
            time.sleep(0.1)
        events = read_journal(journal)
        committed = _committed(events)
        # The node of rank 1 (the first round's active nodes are the first two to join: node 0, the store host, and
        # node 1 or 2), the other one the standby.
        (pid,) = [e["pid"] for e in events if e["event"] == "start" and e["rank"] == 1]
        lost = nodes.node_of(pid)
        assert lost in (1, 2), f"rank 1 (pid {pid}) runs on no node's process tree"
        standby = 3 - lost
        lost_at = nodes.lose(lost)
        # The standby takes the lost node's rank; then the lost node's replacement starts and waits as a standby.
        deadline = time.monotonic() + 60
        while not any(e["event"] == "resumed" and e["time"] > lost_at for e in read_journal(journal)):
            assert time.monotonic() < deadline, "no resume within 60 s of the loss:\n" + nodes.log(0)[-4000:]
            time.sleep(0.1)
        nodes.start(lost)
        codes = nodes.wait([0, 1, 2], timeout_s=150)
        logs = {i: nodes.log(i) for i in range(3)}
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else {}
    return SpareRun(lost, standby, lost_at, committed, codes, read_journal(journal), metrics, logs)


@pytest.fixture(scope="module")
def spare_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SpareRun:
    return lose_an_active_node_with_a_spare(tmp_path_factory.mktemp("spares"), tiny_model_dir)


@pytest.mark.timeout(300)
def test_a_standby_takes_a_lost_nodes_rank_and_resumes_from_the_checkpoint_within_seconds(spare_run: SpareRun) -> None:
    run = spare_run
    assert run.codes == {0: 0, 1: 0, 2: 0}, run.logs[0][-3000:] + run.logs[2][-3000:]
    # The standby trained in one round only, the one after the loss, as rank 1 (NVRx 0.7.0's own log lines).
    joined = [line for line in run.logs[run.standby].splitlines() if "has joined the rendezvous" in line]
    assert len(joined) == 1, joined
    assert "as rank 1 in a world of size 2" in joined[0]
    (resumed,) = [e for e in run.events if e["event"] == "resumed" and e["time"] > run.lost_at]
    # From a checkpoint committed before the loss (a later one may have been committed in the meantime).
    assert run.committed_at_loss <= resumed["step"] < STEPS
    assert resumed["restart"] == 1
    recovery_s = resumed["time"] - run.lost_at
    assert 0 < recovery_s < 30, f"the standby took {recovery_s:.1f} s to resume"
    finished = [e for e in run.events if e["event"] == "finished"]
    assert [e["step"] for e in finished] == [STEPS]
    # Trained at the active world size throughout: 2 ranks, one per active node.
    assert run.metrics["world_size"] == 2


@pytest.mark.timeout(300)
def test_the_lost_nodes_replacement_waits_as_a_standby_and_exits_0(spare_run: SpareRun) -> None:
    replacement = spare_run.logs[spare_run.lost].split("Starting elastic_operator")[-1]
    # It never trained (no failure opened another round), and left when the job closed the rendezvous.
    assert "has joined the rendezvous" not in replacement
    assert "detected that rendezvous was permanently closed" in replacement
    assert spare_run.codes[spare_run.lost] == 0

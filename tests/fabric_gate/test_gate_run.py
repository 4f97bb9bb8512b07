"""The gate in a job: real processes on gloo (one per rank, NODE_NAME per simulated node), a CPU rehearsal with a
fault injected at the gate for one node, a loopback API server and the real remediation controller polling it: the
verdict, the node search over real subgroups, the verdict Events, the controller's taint and answers, each pod's
termination message and verdict file, the bounded failures, the exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.fabric_controller.objects_api import ObjectsApi
from tests.fabric_controller.test_loop import taints
from tests.tiers import starts_training_processes
from training.fabric_gate import EXIT_FAILED, EXIT_RETRY
from training.fabric_verdict import TAINT_KEY, TAKEN_REASON, VERDICT_REASON

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Rank:
    code: int
    verdict: dict[str, object]
    output: str


@starts_training_processes
def gated_job(tmp: Path, nodes: list[str], ranks_per_node: int, env: dict[str, str]) -> list[Rank]:
    world = len(nodes) * ranks_per_node
    (tmp / "store-port").unlink(missing_ok=True)  # rank 0 publishes its store's port there (gate_worker)
    procs = []
    for rank in range(world):
        node = nodes[rank // ranks_per_node]
        pod = tmp / f"pod-{node}"
        child_env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "NODE_NAME": node,
            "LOCAL_RANK": str(rank % ranks_per_node),
            "POD_NAMESPACE": "training",
            "POD_NAME": f"gated-{node}",
            "POD_UID": f"uid-gated-{node}",
            "FABRIC_GATE_POD_DIR": str(pod),
            "FABRIC_GATE_TERMINATION_LOG": str(pod / "termination-log"),
            "FABRIC_GATE_RUN_ID": "run-1",
            "PLATFORM_JOB_NAME": "gated",
            "PLATFORM_EMF_CONTAINER_LOG": "",
            **env,
        }
        pod.mkdir(parents=True, exist_ok=True)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.fabric_gate.gate_worker", str(rank), str(world), str(tmp)],
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    ranks = []
    for proc, out in zip(procs, outs, strict=True):
        line = next((x for x in out.splitlines() if x.startswith("VERDICT ")), None)
        # Every rank's output: a rank that fails in the rendezvous shows up as its peer's "Connection closed by peer".
        assert line is not None, "\n".join(
            f"--- rank {r} (exit {p.returncode}):\n{o}" for r, (p, o) in enumerate(zip(procs, outs, strict=True))
        )
        ranks.append(Rank(proc.returncode, json.loads(line.removeprefix("VERDICT ")), out))
    return ranks


def test_cpu_rehearsal_without_injection_reports_not_run(tmp_path: Path) -> None:
    ranks = gated_job(tmp_path, ["node-0", "node-1"], 1, {"PLATFORM_REHEARSAL": "cpu"})
    assert [r.code for r in ranks] == [0, 0]
    assert {r.verdict["outcome"] for r in ranks} == {"NOT RUN"}
    assert "CPU rehearsal (PLATFORM_REHEARSAL=cpu): no NCCL, no EFA" in ranks[0].output


def test_injected_slow_node_of_four_is_found_by_pairs_taken_out_and_the_pods_exit_retryable(
    tmp_path: Path, controlled: ObjectsApi
) -> None:
    env = {"PLATFORM_REHEARSAL": "cpu", "FABRIC_GATE_INJECT": "slow:node-2", "FABRIC_GATE_API_URL": controlled.url}
    nodes = ["node-0", "node-1", "node-2", "node-3"]
    ranks = gated_job(tmp_path, nodes, 1, env)
    assert [r.code for r in ranks] == [EXIT_RETRY] * 4, ranks[0].output
    verdict = ranks[0].verdict
    assert all(r.verdict["summary"] == verdict["summary"] for r in ranks)  # one verdict per job
    assert verdict["suspects"] == ["node-2"]
    assert "pair test(s)" in str(verdict["localization"])
    # Only the pod on the suspect node spoke, for its own node; the controller took that node out.
    assert [e["involvedObject"]["name"] for e in controlled.events(VERDICT_REASON)] == ["gated-node-2"]
    assert [t["key"] for t in taints(controlled, "node-2")] == [TAINT_KEY]
    assert all(taints(controlled, n) == [] for n in nodes if n != "node-2")
    assert {e["involvedObject"]["kind"] for e in controlled.events(TAKEN_REASON)} == {"Node", "Job", "Pod"}
    assert "node-2: taken out" in ranks[0].output
    for node in nodes:
        pod = tmp_path / f"pod-{node}"
        assert (pod / "termination-log").read_text().startswith("FABRIC GATE FAIL")
        assert json.loads((pod / "verdict.json").read_text())["exit_code"] == EXIT_RETRY
    # The second gate failure of the same run is the last: the job fails with the verdict.
    for node in nodes:
        (tmp_path / f"pod-{node}" / "verdict.json").unlink()
    again = gated_job(tmp_path, nodes, 1, env)
    assert [r.code for r in again] == [EXIT_FAILED] * 4


def test_injected_fallback_on_one_of_two_nodes_names_it(tmp_path: Path, controlled: ObjectsApi) -> None:
    env = {"PLATFORM_REHEARSAL": "cpu", "FABRIC_GATE_INJECT": "fallback:node-1", "FABRIC_GATE_API_URL": controlled.url}
    ranks = gated_job(tmp_path, ["node-0", "node-1"], 2, env)
    assert [r.code for r in ranks] == [EXIT_RETRY] * 4, ranks[0].output
    assert ranks[0].verdict["suspects"] == ["node-1"]
    assert "rank 2 on" in str(ranks[0].verdict["summary"])
    assert taints(controlled, "node-1")[0]["value"] == "fallback"


def test_injected_slow_node_of_two_is_named_by_the_per_node_checks(tmp_path: Path, controlled: ObjectsApi) -> None:
    env = {"PLATFORM_REHEARSAL": "cpu", "FABRIC_GATE_INJECT": "slow:node-0", "FABRIC_GATE_API_URL": controlled.url}
    ranks = gated_job(tmp_path, ["node-0", "node-1"], 2, env)
    assert [r.code for r in ranks] == [EXIT_RETRY] * 4, ranks[0].output
    assert ranks[0].verdict["suspects"] == ["node-0"]
    assert "intra-node all-reduce" in str(ranks[0].verdict["localization"])


def test_a_new_pod_among_proven_ones_is_gated_by_the_whole_gang(tmp_path: Path, controlled: ObjectsApi) -> None:
    """A hot spare taking a lost node's ranks (or a replacement pod) joins pods whose gate passed earlier in this run:
    the gate is a collective, so either every rank runs it or none does, and the new pod's fabric is proven before
    its first step. Here the newcomer's node is the faulty one."""
    proven = {"outcome": "PASS", "exit_code": 0, "summary": "FABRIC GATE PASS"}
    (tmp_path / "pod-node-0").mkdir()
    (tmp_path / "pod-node-0" / "verdict.json").write_text(json.dumps(proven))
    env = {"PLATFORM_REHEARSAL": "cpu", "FABRIC_GATE_INJECT": "fallback:node-1", "FABRIC_GATE_API_URL": controlled.url}
    ranks = gated_job(tmp_path, ["node-0", "node-1"], 1, env)
    assert [r.code for r in ranks] == [EXIT_RETRY] * 2, ranks[0].output
    assert ranks[0].verdict["suspects"] == ["node-1"]
    assert taints(controlled, "node-1")[0]["value"] == "fallback"

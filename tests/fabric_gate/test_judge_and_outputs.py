"""Judge mode on recorded logs (the published-format corpus), the gate's API calls against a loopback API server,
the pod's termination message and verdict file, the EMF line, and the supervisor's exit code."""

from __future__ import annotations

import dataclasses
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fabric_gate.fake_apiserver import FakeApiServer
from training import emf
from training.fabric_gate import (
    EXIT_FAILED,
    EXIT_RETRY,
    Bandwidth,
    Floor,
    GateVerdict,
    KubeApi,
    Outcome,
    RankTransport,
    emf_document,
    report_own_node,
    write_pod_verdict,
    write_termination_message,
)

CORPUS = Path(__file__).resolve().parent.parent / "fabric_analyzer" / "corpus"
EFA_LOG = str(CORPUS / "efa_ofi1.7_old_wording_plain.log")
MIXED_LOG = str(CORPUS / "mixed_one_of_four_ranks_socket.log")
DEDUP_LOG = str(CORPUS / "efa_ray_dedup_hides_ranks.log")


def judge(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.fabric_gate", "judge", *argv], capture_output=True, text=True, timeout=60
    )


def test_judge_efa_above_the_floor_passes() -> None:
    done = judge("--instance-type", "p5.48xlarge", "--nodes", "2", "--busbw", "437.79", EFA_LOG)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FABRIC GATE PASS: all 4 rank(s) on EFA" in done.stdout


def test_judge_efa_below_the_floor_fails_naming_size_and_floor() -> None:
    done = judge("--instance-type", "p5.48xlarge", "--nodes", "2", "--busbw", "313.29", "--json", EFA_LOG)
    assert done.returncode == 1
    verdict = json.loads(done.stdout)
    assert verdict["outcome"] == "FAIL"
    assert "313.29 GB/s at 2 GiB is under the floor 350.2 GB/s (p5.48xlarge) from 2 GiB" in verdict["summary"]


def test_judge_a_socket_rank_fails_naming_it() -> None:
    done = judge("--instance-type", "p5.48xlarge", "--nodes", "4", MIXED_LOG)
    assert done.returncode == 1
    assert "1 of 4 rank(s) are not on EFA: rank 3 on" in done.stdout


def test_judge_too_few_ranks_or_nodes_is_unknown() -> None:
    assert judge("--instance-type", "p5.48xlarge", "--nodes", "2", DEDUP_LOG).returncode == 3
    done = judge("--instance-type", "p5.48xlarge", "--nodes", "3", "--busbw", "437.79", EFA_LOG)
    assert done.returncode == 3
    assert "too few nodes" in done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--instance-type", "m7i.xlarge", "--nodes", "2", EFA_LOG],
        ["--instance-type", "p5.48xlarge", "--nodes", "2", "/nonexistent.log"],
        ["--instance-type", "p5.48xlarge", "--nodes", "0", EFA_LOG],
        ["--instance-type", "p5.48xlarge", "--nodes", "2", "--message-bytes", "1024", EFA_LOG],
    ],
)
def test_judge_bad_input_exits_2(argv: list[str]) -> None:
    done = judge(*argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error" in done.stderr


# --- the API server ------------------------------------------------------------------------------


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.add_node("node-a")
    server.add_node("node-b", taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}])
    server.start()
    yield server
    server.stop()


FAILED = GateVerdict(
    Outcome.FAIL,
    ("all 16 rank(s) on EFA", "bus bandwidth 120.00 GB/s at 2 GiB is under the floor"),
    nodes=("node-a", "node-b", "node-c"),
    bandwidth=Bandwidth(2 << 30, 120.0),
    floor=Floor(350.2, 2 << 30, "p5.48xlarge"),
    bandwidth_failed=True,
    suspects=("node-b",),
    seconds=21.5,
)


def test_a_pod_without_an_api_or_its_names_reports_why_and_takes_nothing_out(apiserver: FakeApiServer) -> None:
    env = {"NODE_NAME": "node-b", "POD_NAME": "p", "POD_UID": "u", "POD_NAMESPACE": "training"}
    assert report_own_node(FAILED, None, workload=None, environ=env).text.startswith("no Kubernetes API")
    partial = {k: v for k, v in env.items() if k != "POD_UID"}
    outcome = report_own_node(FAILED, KubeApi(apiserver.url, "t"), workload=None, environ=partial)
    assert (outcome.taken, outcome.text) == (False, "POD_NAME and POD_UID are not set: no verdict Event")
    assert apiserver.events == []


def test_the_verdict_event_names_the_pod_and_its_node_and_the_gate_waits_for_an_answer(
    apiserver: FakeApiServer,
) -> None:
    env = {"NODE_NAME": "node-b", "POD_NAME": "nvrx-fsdp-1", "POD_UID": "uid-1", "POD_NAMESPACE": "training"}
    outcome = report_own_node(
        FAILED, KubeApi(apiserver.url, "token-123"), workload="Job/nvrx-fsdp", environ=env, wait_s=0.3, poll_s=0.1
    )
    (event,) = apiserver.events
    assert event["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": "training",
        "name": "nvrx-fsdp-1",
        "uid": "uid-1",
    }
    assert event["metadata"]["namespace"] == "training"
    assert event["reason"] == "FabricGateFailed"
    assert event["metadata"]["annotations"]["fabric-gate.platform/node"] == "node-b"
    assert event["metadata"]["annotations"]["fabric-gate.platform/taint"] == "below-floor"
    assert "suspect node(s): node-b" in event["message"]
    assert {r.authorization for r in apiserver.requests} == {"Bearer token-123"}
    # Nobody answered: nothing was taken out, and the gate says so.
    assert not outcome.taken
    assert "no answer from the remediation controller" in outcome.text


def test_in_cluster_api_needs_the_token(tmp_path: Path) -> None:
    assert KubeApi.in_cluster({"KUBERNETES_SERVICE_HOST": "10.100.0.1"}, sa_dir=tmp_path) is None
    (tmp_path / "token").write_text("abc\n")
    (tmp_path / "ca.crt").write_text("")
    with pytest.raises(ssl.SSLError):  # the pod's CA is what the connection trusts: an empty one is refused
        KubeApi.in_cluster({"KUBERNETES_SERVICE_HOST": "10.100.0.1"}, sa_dir=tmp_path)


# --- the pod's outputs ---------------------------------------------------------------------------


def test_termination_message_and_verdict_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination-log"
    assert write_termination_message("x" * 5000, {"FABRIC_GATE_TERMINATION_LOG": str(log)})
    assert len(log.read_bytes()) == 4096
    path = write_pod_verdict(FAILED, EXIT_RETRY, tmp_path / "pod")
    saved = json.loads(path.read_text())
    assert (saved["outcome"], saved["exit_code"], saved["suspects"]) == ("FAIL", EXIT_RETRY, ["node-b"])


def test_the_first_failing_verdict_of_the_pod_stays(tmp_path: Path) -> None:
    # ft_launcher may restart the workers before the supervisor has stopped it (its poll, the launcher's grace): the
    # restarted gate then fails again with the run's failures spent (76), but the pod's verdict is the one the
    # supervisor acts on, the first (75: the node was taken out, the pods come back elsewhere). Seen in a make test.
    pod = tmp_path / "pod"
    write_pod_verdict(FAILED, EXIT_RETRY, pod)
    write_pod_verdict(FAILED, EXIT_FAILED, pod)
    write_pod_verdict(dataclasses.replace(FAILED, outcome=Outcome.PASS, suspects=()), 0, pod)
    saved = json.loads((pod / "verdict.json").read_text())
    assert (saved["outcome"], saved["exit_code"]) == ("FAIL", EXIT_RETRY)


def test_emf_line_the_alarms_can_read() -> None:
    doc = emf_document(FAILED, job_name="nvrx-fsdp", instance_type="p5.48xlarge")
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == emf.NAMESPACE
    assert {m["Name"] for m in directive["Metrics"]} == {
        "FabricGateFailed",
        "FabricGateSeconds",
        "FabricGateBusBandwidth",
    }
    assert directive["Dimensions"] == [["InstanceType"], ["JobName", "InstanceType"]]
    assert (doc["FabricGateFailed"], doc["InstanceType"], doc["Suspects"]) == (1.0, "p5.48xlarge", ["node-b"])


# --- the supervisor ------------------------------------------------------------------------------


def supervise(tmp_path: Path, child: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "training.fabric_gate",
            "supervise",
            "--verdict-file",
            str(tmp_path / "verdict.json"),
            "--",
            sys.executable,
            "-c",
            child,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_supervisor_passes_the_launchers_status_through(tmp_path: Path) -> None:
    assert supervise(tmp_path, "raise SystemExit(0)").returncode == 0
    assert supervise(tmp_path, "raise SystemExit(1)").returncode == 1


def test_supervisor_stops_the_launcher_and_exits_with_the_gates_code(tmp_path: Path) -> None:
    """The launcher would restart its workers into the same verdict; the supervisor stops it once a verdict is in
    the pod and exits with the gate's code (what the Job's podFailurePolicy reads)."""
    verdict = json.dumps({"outcome": "FAIL", "exit_code": EXIT_FAILED, "summary": "FABRIC GATE FAIL: test"})
    child = (
        "import pathlib, time\n"
        f"pathlib.Path({str(tmp_path / 'verdict.json')!r}).write_text({verdict!r})\n"
        "time.sleep(60)\n"
    )
    done = supervise(tmp_path, child)
    assert done.returncode == EXIT_FAILED
    assert "FABRIC GATE FAIL: test" in done.stderr


def test_transport_record_names_fallbacks() -> None:
    assert RankTransport(0, "h", "n", "socket", "r").fell_back
    assert RankTransport(0, "h", "n", "degraded", "r").fell_back
    assert not RankTransport(0, "h", "n", "efa", "r").fell_back


def test_the_gate_failure_a_ray_train_worker_raises_survives_pickling() -> None:
    # Ray ships a worker's exception to the train controller pickled; seen in the Ray gate rehearsal before the fix:
    # "TypeError: GateFailedError.__init__() missing 1 required positional argument: 'exit_code'" in TrainController.
    import pickle

    from training.fabric_gate import GateFailedError

    error = pickle.loads(pickle.dumps(GateFailedError(FAILED, 75)))
    assert (error.exit_code, error.verdict, str(error)) == (75, FAILED, FAILED.summary())

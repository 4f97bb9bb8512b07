"""`trainctl status` and `trainctl logs` against the loopback Kubernetes API server, and the job query
that runs in the head pod, run here with the pinned Ray SDK against a stand-in of Ray's job API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.trainctl.fake_kube import ExecSession, FakeKube, reply
from tests.trainctl.fake_ray import HEAD_LABELS, WORKER_LABELS, FakeRayHead
from tests.trainctl.test_submit import HEAD, TOKEN, write_kubeconfig
from trainctl.cli import main
from trainctl.exit_codes import ExitCode
from trainctl.logs import RAY_TEMP_DIR, session_logs_command
from trainctl.ray_jobs import DASHBOARD, QUERY_SCRIPT, logs_command, parse_query_output, query_command
from training import fabric_analyzer

WORKERS = ("training-g6-worker-a", "training-g6-worker-b")


def efa_rank(host: str, pid: int, rank: int) -> list[str]:
    p = f"{host}:{pid}:{pid + 70} [0] NCCL INFO"
    return [
        f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        f"{p} NET/OFI Initializing aws-ofi-nccl 1.16.0",
        f"{p} NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)",
        f"{p} Using network Libfabric",
        f"{p} ncclCommInitRank comm 0x5581 rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 38000 - Init COMPLETE",
    ]


def socket_rank(host: str, pid: int, rank: int) -> list[str]:
    p = f"{host}:{pid}:{pid + 70} [0] NCCL INFO"
    return [
        f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.27.3+cuda12.9",
        f"{host}:{pid}:{pid} [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
        f"{p} NET/Socket : Using [0]eth0:10.10.1.9<0>",
        f"{p} Using network Socket",
        f"{p} ncclCommInitRank comm 0x5581 rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 38000 - Init COMPLETE",
    ]


def chunks(lines: list[str], *, noise: str = "(RayTrainWorker pid=181) epoch 0 step 3 loss=2.1\n") -> list[bytes]:
    """The log as a container writes it: a line split across chunks, other output between."""
    text = noise + "".join(f"{line}\n" for line in lines) + noise
    middle = len(text) // 2 + 3
    return [text[:middle].encode(), text[middle:].encode()]


@pytest.fixture
def head(kube: FakeKube) -> FakeRayHead:
    kube.add_pod(HEAD, labels=HEAD_LABELS)
    for name in WORKERS:
        kube.add_pod(name, labels=WORKER_LABELS, containers=("ray-worker", "log-shipper"))
    kube.add_pod(
        "qwen-finetune-abcde-worker-x",
        labels={**WORKER_LABELS, "ray.io/cluster": "qwen-finetune-abcde"},
        containers=("ray-worker",),
    )
    return FakeRayHead(kube)


@pytest.fixture
def kubeconfig(kube: FakeKube, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url)


def cli(capsys: pytest.CaptureFixture[str], command: str, kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    code = main([command, "--kubeconfig", str(kubeconfig), *args])
    out, err = capsys.readouterr()
    return code, out, err


RAYJOB = {
    "apiVersion": "ray.io/v1",
    "kind": "RayJob",
    "metadata": {"name": "qwen-finetune", "namespace": "ray"},
    "status": {
        "jobStatus": "RUNNING",
        "jobDeploymentStatus": "Running",
        "rayClusterName": "qwen-finetune-abcde",
        "jobId": "qwen-finetune-8fz2k",
        "startTime": "2026-01-01T00:00:00Z",
    },
}


# --- status ---------------------------------------------------------------------------------------


def test_status_tables_list_ray_jobs_and_rayjobs(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    head.add_job("trainctl-a", "SUCCEEDED", "python train.py --lr 3e-4", end_time=1_767_225_660_000)
    head.add_job(
        "trainctl-b", "FAILED", "python -m training.ray_finetune " + "--flag " * 20, start_time=1_767_229_200_000
    )
    kube.rayjobs.append(RAYJOB)
    code, out, err = cli(capsys, "status", kubeconfig)
    assert code == ExitCode.OK, err
    lines = out.splitlines()
    assert lines[0] == f"Ray jobs on ray/{HEAD} (RayCluster training):"
    assert lines[1].split() == ["SUBMISSION", "ID", "STATUS", "START", "END", "ENTRYPOINT"]
    assert lines[2].split()[:4] == ["trainctl-a", "SUCCEEDED", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"]
    assert lines[3].split()[:4] == ["trainctl-b", "FAILED", "2026-01-01T01:00:00Z", "-"]
    assert lines[3].endswith("...")  # long entrypoints are clipped in the table
    assert "RayJobs in namespace ray:" in lines
    assert out.splitlines()[-1].split() == [
        "qwen-finetune", "RUNNING", "Running", "qwen-finetune-abcde", "2026-01-01T00:00:00Z", "-",
    ]  # fmt: skip
    assert kube.commands() == [query_command("list")]
    assert [r.path for r in kube.requests if "rayjobs" in r.path] == ["/apis/ray.io/v1/namespaces/ray/rayjobs"]


def test_status_json(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    head.add_job("trainctl-a", "RUNNING")
    kube.rayjobs.append(RAYJOB)
    code, out, err = cli(capsys, "status", kubeconfig, "--json")
    assert code == ExitCode.OK
    # Progress and the report's warnings (stderr as without --json; the document has no warnings field).
    assert [line.split(":")[0] for line in err.splitlines()] == ["trainctl", "warning"], err
    document: dict[str, Any] = json.loads(out)
    assert document["exit_code"] == 0
    assert document["errors"] == []
    assert document["head_pod"] == HEAD
    assert [(j["submission_id"], j["status"], j["start_time"]) for j in document["ray_jobs"]] == [
        ("trainctl-a", "RUNNING", "2026-01-01T00:00:00Z")
    ]
    assert document["rayjobs"] == [
        {
            "name": "qwen-finetune",
            "jobStatus": "RUNNING",
            "jobDeploymentStatus": "Running",
            "rayClusterName": "qwen-finetune-abcde",
            "jobId": "qwen-finetune-8fz2k",
            "startTime": "2026-01-01T00:00:00Z",
            "endTime": None,
            "message": None,
        }
    ]


def test_status_without_a_head_pod_still_lists_rayjobs_and_exits_2(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    kube.rayjobs.append(RAYJOB)
    code, out, err = cli(capsys, "status", kubeconfig)
    assert code == ExitCode.ERROR
    assert "error: no Running Ray head pod in namespace ray" in err
    assert "qwen-finetune" in out
    assert "Ray jobs on" not in out


def test_status_without_the_rayjob_crd_reports_it(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    kube.rayjobs_installed = False
    head.add_job("trainctl-a", "SUCCEEDED")
    code, out, _err = cli(capsys, "status", kubeconfig, "--json")
    document = json.loads(out)
    assert code == ExitCode.ERROR == document["exit_code"]
    assert document["rayjobs"] is None
    assert document["ray_jobs"][0]["submission_id"] == "trainctl-a"
    assert document["errors"] == [
        "list rayjobs.ray.io in namespace ray: 404 Not Found (the server could not find the requested resource)"
    ]


def test_status_reports_a_refused_token(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    """401 (an IAM principal without an access entry, an expired token) is said as such."""
    kube.accepted_tokens = {"some-other-token"}
    code, _, err = cli(capsys, "status", kubeconfig)
    assert code == ExitCode.ERROR
    assert "401 Unauthorized (Unauthorized): the token was refused" in err
    assert "access entries (ClusterConfig.admin_principals)" in err
    kube.accepted_tokens = {TOKEN}
    assert cli(capsys, "status", kubeconfig)[0] == ExitCode.OK


def test_an_unreachable_api_server_exits_2(dead_host: str, tmp_path: Path, capsys) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", f"http://{dead_host}")
    code, out, _ = cli(capsys, "status", config, "--json")
    document = json.loads(out)
    assert code == ExitCode.ERROR == document["exit_code"]
    assert document["ray_jobs"] is None
    assert document["rayjobs"] is None
    assert (
        "list pods -l ray.io/node-type=head,ray.io/cluster=training in namespace ray: cannot reach the API server"
        in (document["errors"][0])
    )


def test_a_missing_kubeconfig_exits_2(kube: FakeKube, tmp_path: Path, capsys) -> None:
    code, _, err = cli(capsys, "status", tmp_path / "missing-kubeconfig")
    assert code == ExitCode.ERROR
    assert f"kubeconfig {tmp_path / 'missing-kubeconfig'} does not exist" in err
    assert kube.requests == []


# --- logs of a job ----------------------------------------------------------------------------------


def test_logs_of_a_job_run_ray_job_logs_in_the_head(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys
) -> None:
    head.add_job("trainctl-a", "SUCCEEDED", logs=["epoch 0 loss=2.3\n", "epoch 1 loss=1.9\n"])
    code, out, err = cli(capsys, "logs", kubeconfig, "--job", "trainctl-a", "--follow")
    assert code == ExitCode.OK, err
    assert out == "epoch 0 loss=2.3\nepoch 1 loss=1.9\n"
    assert kube.commands() == [logs_command("trainctl-a", follow=True)]
    assert logs_command("trainctl-a", follow=True) == [
        "ray", "job", "logs", "trainctl-a", "--address", "http://localhost:8265", "--follow",
    ]  # fmt: skip
    assert kube.authorizations() == {f"Bearer {TOKEN}"}


def test_logs_of_an_unknown_job_exit_2(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    code, out, err = cli(capsys, "logs", kubeconfig, "--job", "nope")
    assert code == ExitCode.ERROR
    assert out == ""
    assert "Job nope does not exist" in err  # Ray's own stderr, passed through
    assert "`ray job logs nope`" in err


def test_fabric_verdict_on_a_jobs_log(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    lines = [f"(RayTrainWorker pid=181, ip=10.10.1.7) {line}\n" for line in efa_rank("ip-10-10-1-7", 181, 0)]
    lines += [f"(RayTrainWorker pid=190, ip=10.10.1.8) {line}\n" for line in efa_rank("ip-10-10-1-8", 190, 1)]
    head.add_job("trainctl-a", "SUCCEEDED", logs=lines)
    code, out, _ = cli(capsys, "logs", kubeconfig, "--job", "trainctl-a", "--fabric")
    assert code == ExitCode.OK
    assert "PASS: all 2 rank(s) used EFA" in out
    assert "NCCL INFO" not in out  # the verdict, not the log


# --- logs of pods -----------------------------------------------------------------------------------


def test_worker_logs_are_prefixed_per_pod_and_only_of_the_chosen_cluster(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys
) -> None:
    kube.add_log(WORKERS[0], "ray-worker", ["worker a line 1\nworker a ", "line 2\n"])
    kube.add_log(WORKERS[1], "ray-worker", ["worker b line 1\nno newline at the end"])
    code, out, err = cli(capsys, "logs", kubeconfig, "--workers")
    assert code == ExitCode.OK, err
    assert out.splitlines() == [
        f"[pod/{WORKERS[0]}/ray-worker] worker a line 1",
        f"[pod/{WORKERS[0]}/ray-worker] worker a line 2",
        f"[pod/{WORKERS[1]}/ray-worker] worker b line 1",
        f"[pod/{WORKERS[1]}/ray-worker] no newline at the end",
    ]
    selectors = [r.query["labelSelector"][0] for r in kube.requests if r.path == "/api/v1/namespaces/ray/pods"]
    assert selectors == ["ray.io/node-type=worker,ray.io/cluster=training"]
    log_requests = [r for r in kube.requests if r.path.endswith("/log")]
    assert [(r.path.split("/")[-2], r.query["container"]) for r in log_requests] == [
        (WORKERS[0], ["ray-worker"]),
        (WORKERS[1], ["ray-worker"]),
    ]


def test_following_worker_logs_streams_every_pod_at_once(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys
) -> None:
    kube.add_log(WORKERS[0], "ray-worker", [f"a {i}\n" for i in range(5)], delay_s=0.02)
    kube.add_log(WORKERS[1], "ray-worker", [f"b {i}\n" for i in range(5)], delay_s=0.02)
    code, out, err = cli(capsys, "logs", kubeconfig, "--workers", "--follow")
    assert code == ExitCode.OK, err
    got = out.splitlines()
    for worker, letter in zip(WORKERS, "ab", strict=True):
        assert [line for line in got if worker in line] == [f"[pod/{worker}/ray-worker] {letter} {i}" for i in range(5)]
    assert {r.query.get("follow", ["-"])[0].lower() for r in kube.requests if r.path.endswith("/log")} == {"true"}


def test_pod_logs_of_one_container_and_the_previous_instance(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys
) -> None:
    kube.add_log(WORKERS[0], "log-shipper", ["shipped\n"])
    code, out, _ = cli(capsys, "logs", kubeconfig, "--pod", WORKERS[0], "--container", "log-shipper", "--previous")
    assert code == ExitCode.OK
    assert out == "shipped\n"  # one pod: no prefix
    (request,) = [r for r in kube.requests if r.path.endswith("/log")]
    assert request.query["container"] == ["log-shipper"]
    assert request.query["previous"][0].lower() == "true"
    code, _, err = cli(capsys, "logs", kubeconfig, "--pod", WORKERS[0], "--container", "sidecar")
    assert code == ExitCode.ERROR
    assert "has no container 'sidecar' (it has: ray-worker, log-shipper)" in err


def test_pod_logs_errors_exit_2(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    code, _, err = cli(capsys, "logs", kubeconfig, "--pod", "no-such-pod")
    assert code == ExitCode.ERROR
    assert 'get pod ray/no-such-pod: 404 Not Found (pods "no-such-pod" not found)' in err
    code, _, err = cli(capsys, "logs", kubeconfig, "--pod", WORKERS[0])  # no log scripted: still starting
    assert code == ExitCode.ERROR
    assert "is waiting to start: ContainerCreating" in err
    code, _, err = cli(capsys, "logs", kubeconfig, "--workers", "--ray-cluster", "gone")
    assert code == ExitCode.ERROR
    assert "no Ray worker pods in namespace ray (-l ray.io/node-type=worker,ray.io/cluster=gone)" in err


# --- the fabric verdict on worker logs ---------------------------------------------------------------


EFA_0 = efa_rank("ip-10-10-1-7", 181, 0)


@pytest.fixture
def ray_sessions(kube: FakeKube, tmp_path: Path) -> Path:
    """Each worker pod's Ray temp dir as a folder here (tmp_path/<pod>/session_latest/logs): the session-log command
    trainctl sends is run for real by sh against the exec'd pod's folder instead of /tmp/ray."""

    def handler(session: ExecSession) -> int:
        command = session.command
        assert command[-1] == RAY_TEMP_DIR
        done = subprocess.run(
            [*command[:-1], str(tmp_path / "sessions" / session.call.pod)], capture_output=True, timeout=30
        )
        session.stdout(done.stdout)
        session.stderr(done.stderr)
        return done.returncode

    kube.on_exec(session_logs_command()[:-1], handler)
    return tmp_path / "sessions"


def session_log(root: Path, pod: str, name: str, lines: list[str]) -> None:
    logs = root / pod / "session_2026-11-30_10-00-00_000000_1" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / name).write_text("".join(f"{line}\n" for line in lines))
    latest = root / pod / "session_latest"
    if not latest.exists():
        latest.symlink_to(logs.parent.name)


RAY_START_NOISE = ["[2026-11-30 10:00:01,000 I 7 7] Ray runtime started.", "--block: waiting"]


def test_workers_fabric_reads_the_ray_session_worker_logs(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, ray_sessions: Path, capsys
) -> None:
    """Ray Train workers are actors: NCCL's lines are in /tmp/ray/session_*/logs/worker-*.out of each worker pod,
    never in the container log, which holds only `ray start` output."""
    for worker, rank in zip(WORKERS, (efa_rank("ip-10-10-1-7", 181, 0), efa_rank("ip-10-10-1-8", 190, 1)), strict=True):
        kube.add_log(worker, "ray-worker", chunks(RAY_START_NOISE))
        session_log(ray_sessions, worker, "worker-5f1e-01000000-181.out", ["(RayTrainWorker) step 1", *rank])
        session_log(ray_sessions, worker, "worker-5f1e-01000000-181.err", ["a warning"])
    code, out, _ = cli(capsys, "logs", kubeconfig, "--workers", "--fabric", "--json")
    document = json.loads(out)
    assert (code, document["verdict"], document["ranks_seen"], document["world_size"]) == (ExitCode.OK, "efa", 2, 2)
    assert f"pod/{WORKERS[0]}/session:worker-5f1e-01000000-181.out" in document["sources"]
    assert f"pod/{WORKERS[1]}/session:worker-5f1e-01000000-181.err" in document["sources"]


def test_workers_fabric_with_a_rank_missing_from_the_session_logs_is_no_evidence(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, ray_sessions: Path, capsys
) -> None:
    for worker in WORKERS:
        kube.add_log(worker, "ray-worker", chunks(RAY_START_NOISE))
    session_log(ray_sessions, WORKERS[0], "worker-aa-01000000-181.out", efa_rank("ip-10-10-1-7", 181, 0))
    code, out, _ = cli(capsys, "logs", kubeconfig, "--workers", "--fabric")
    assert code == ExitCode.NO_EVIDENCE
    assert "UNKNOWN: the input shows 1 of the 2 ranks NCCL reported" in out


def test_workers_fabric_when_the_session_logs_cannot_be_read_is_an_error(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys
) -> None:
    for worker, rank in zip(WORKERS, (efa_rank("ip-10-10-1-7", 181, 0), efa_rank("ip-10-10-1-8", 190, 1)), strict=True):
        kube.add_log(worker, "ray-worker", chunks(rank))
    kube.on_exec(session_logs_command()[:-1], reply(stderr="sh: 1: cat: Permission denied\n", exit_code=1))
    code, out, err = cli(capsys, "logs", kubeconfig, "--workers", "--fabric")
    assert code == ExitCode.ERROR
    assert "could not run: 2 input(s) could not be read" in out  # one per worker pod
    assert f"Ray session logs in pod ray/{WORKERS[0]}" in err
    assert "Permission denied" in err


@pytest.mark.parametrize(
    ("first", "second", "expected", "summary"),
    [
        (EFA_0, efa_rank("ip-10-10-1-8", 190, 1), ExitCode.OK, "PASS: all 2 rank(s) used EFA"),
        (EFA_0, socket_rank("ip-10-10-1-8", 190, 1), ExitCode.CHECK_FAILED, "FAIL: 1 of 2 rank(s) fell back from EFA"),
        (["no nccl here"], ["nor here"], ExitCode.NO_EVIDENCE, "UNKNOWN: no NCCL log lines in the input"),
    ],
)
def test_workers_fabric_verdict_is_the_analyzers(
    kube: FakeKube,
    head: FakeRayHead,
    kubeconfig: Path,
    ray_sessions: Path,
    capsys,
    first: list[str],
    second: list[str],
    expected: ExitCode,
    summary: str,
) -> None:
    kube.add_log(WORKERS[0], "ray-worker", chunks(first))
    kube.add_log(WORKERS[1], "ray-worker", chunks(second))
    code, out, _ = cli(capsys, "logs", kubeconfig, "--workers", "--fabric")
    assert code == expected
    assert summary in out
    # The same verdict as the analyzer gives on the same text (trainctl fabric-check).
    direct = fabric_analyzer.analyze([*first, "", *second])
    assert int(direct.exit_status) == int(expected)
    code, out, _ = cli(capsys, "logs", kubeconfig, "--workers", "--fabric", "--json")
    document = json.loads(out)
    assert (code, document["exit_code"]) == (expected, int(expected))
    assert sorted(document["sources"]) == [f"pod/{w}/ray-worker" for w in WORKERS]


def test_workers_fabric_with_a_worker_not_started_is_an_error(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, ray_sessions: Path, capsys
) -> None:
    kube.add_log(WORKERS[0], "ray-worker", chunks(efa_rank("ip-10-10-1-7", 181, 0)))
    code, out, err = cli(capsys, "logs", kubeconfig, "--workers", "--fabric")
    assert code == ExitCode.ERROR
    assert "could not run: 1 input(s) could not be read" in out
    assert f'container "ray-worker" in pod "{WORKERS[1]}" is waiting to start' in err


def test_logs_argument_errors(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    assert cli(capsys, "logs", kubeconfig, "--workers", "--json")[0] == ExitCode.ERROR
    assert cli(capsys, "logs", kubeconfig, "--job", "a", "--previous")[0] == ExitCode.ERROR
    assert cli(capsys, "logs", kubeconfig, "--job", "a b")[0] == ExitCode.ERROR
    with pytest.raises(SystemExit) as exit_info:
        main(["logs", "--kubeconfig", str(kubeconfig), "--job", "a", "--workers"])
    assert exit_info.value.code == ExitCode.ERROR
    assert kube.requests == []


# --- the query script with the real Ray SDK ---------------------------------------------------------


DETAILS: dict[str, Any] = {
    "type": "SUBMISSION",
    "job_id": "02000000",
    "submission_id": "trainctl-a",
    "driver_info": None,
    "status": "FAILED",
    "entrypoint": "python train.py",
    "message": "Job entrypoint command failed with exit code 1",
    "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
    "start_time": 1_767_225_600_000,
    "end_time": 1_767_225_660_000,
    "metadata": {},
    "runtime_env": {},
    "driver_agent_http_address": None,
    "driver_node_id": None,
    "driver_exit_code": 1,
}


class _JobApi(BaseHTTPRequestHandler):
    """Ray's job REST API as the dashboard serves it on :8265 (version, list, one job)."""

    def do_GET(self) -> None:
        routes: dict[str, Any] = {
            "/api/version": {"version": "4", "ray_version": "2.58.0", "ray_commit": "0" * 40},
            "/api/jobs/": [DETAILS],
            "/api/jobs/trainctl-a": DETAILS,
        }
        found = self.path in routes
        body = json.dumps(routes[self.path]).encode() if found else b"Job does not exist"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_query_script_prints_job_details_with_the_pinned_ray_sdk() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JobApi)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "RAY_USAGE_STATS_ENABLED": "0"}
    runs = {}
    try:
        for arguments in (("list",), ("get", "missing")):
            command = query_command(*arguments)
            assert command[:4] == ["python", "-c", QUERY_SCRIPT, DASHBOARD]
            runs[arguments] = subprocess.Popen(
                [sys.executable, "-c", QUERY_SCRIPT, address, *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        results = {arguments: process.communicate(timeout=60) for arguments, process in runs.items()}
    finally:
        server.shutdown()
        server.server_close()
    for arguments, process in runs.items():
        assert process.returncode == 0, results[arguments][1].decode()
    listed = parse_query_output(results[("list",)][0])
    assert listed == {
        "jobs": [
            {
                "submission_id": "trainctl-a",
                "job_id": "02000000",
                "type": "SUBMISSION",
                "status": "FAILED",
                "entrypoint": "python train.py",
                "message": "Job entrypoint command failed with exit code 1",
                "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
                "start_time": 1_767_225_600_000,
                "end_time": 1_767_225_660_000,
                "driver_exit_code": 1,
            }
        ]
    }
    assert parse_query_output(results[("get", "missing")][0]) == {"job": None}

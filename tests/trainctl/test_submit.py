"""`trainctl submit` against a loopback Kubernetes API server (tests/trainctl/fake_kube.py) whose exec
endpoint answers as a Ray head pod does (tests/trainctl/fake_ray.py): head-pod selection, the working
directory's tar stream, the exact `ray job submit` command, streamed output and exit codes."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import cdk8s
import pytest
import yaml

from infra.spec import ENVIRONMENTS
from k8s.charts.ray import RayClusterChart
from k8s.images import ImageLock
from tests.trainctl.fake_kube import V5, ExecSession, Failure, FakeKube, reply
from tests.trainctl.fake_ray import HEAD_LABELS, WORKER_LABELS, FakeRayHead
from trainctl.cli import main
from trainctl.eks_auth import RAY_CLUSTER, Target, api_client_from_kubeconfig
from trainctl.exit_codes import ExitCode
from trainctl.kube import (
    UPLOAD_SCRIPT,
    KubeError,
    WorkingDirError,
    exec_in_pod,
    find_head_pod,
    pack_working_dir,
    upload_command,
)
from trainctl.progress import Progress, duration
from trainctl.ray_jobs import DASHBOARD, QUERY_SCRIPT, logs_command, submit_command
from trainctl.submit import SubmitRequest, load_runtime_env, submit

HEAD = "training-head-x8k2p"
# A digest made from content the test owns: the committed lock pins none.
CHART_LOCK = ImageLock.load().with_digest("ray-train", "sha256:" + hashlib.sha256(b"trainctl test image").hexdigest())
TOKEN = "kubeconfig-token-for-tests"


def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "operator"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def head(kube: FakeKube) -> FakeRayHead:
    """A RayCluster `training` (head + two workers) beside another cluster's head, in namespace ray."""
    kube.add_pod(HEAD, labels=HEAD_LABELS)
    kube.add_pod("training-g6-worker-a", labels=WORKER_LABELS, containers=("ray-worker",))
    kube.add_pod(
        "qwen-finetune-abcde-head-zz", labels={**HEAD_LABELS, "ray.io/cluster": "qwen-finetune-abcde"}, node="other"
    )
    return FakeRayHead(kube)


@pytest.fixture
def kubeconfig(kube: FakeKube, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    root = tmp_path / "experiment"
    for name, text in {
        "train.py": "print('training')\n",
        "configs/base.yaml": "lr: 0.0003\n",
        "pkg/model.py": "WIDTH = 1536\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".git/objects/ab/cdef": "blob",
        "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
        ".venv/bin/python": "not a python",
        "data/shard-0.bin": "0123456789",
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "empty").mkdir()
    return root


def run(capsys: pytest.CaptureFixture[str], kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    code = main(["submit", "--kubeconfig", str(kubeconfig), *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- a job end to end --------------------------------------------------------------------------


def test_submit_copies_the_working_dir_runs_ray_job_submit_in_the_head_and_streams_the_output(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, workdir: Path, tmp_path: Path, capsys
) -> None:
    env_file = tmp_path / "env.yaml"
    env_file.write_text("pip: [transformers==5.23.0]\nenv_vars:\n  NCCL_DEBUG: INFO\n  HF_HUB_OFFLINE: '1'\n")
    code, out, err = run(
        capsys,
        kubeconfig,
        "--working-dir",
        str(workdir),
        "--runtime-env",
        str(env_file),
        "--exclude",
        "data",
        "--submission-id",
        "finetune-7",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert code == ExitCode.OK, err
    dest = "/tmp/trainctl/finetune-7"
    runtime_env = '{"env_vars":{"HF_HUB_OFFLINE":"1","NCCL_DEBUG":"INFO"},"pip":["transformers==5.23.0"]}'
    submit_argv = [
        "ray", "job", "submit", "--address", "http://localhost:8265", "--submission-id", "finetune-7",
        "--entrypoint-num-cpus", "1", "--working-dir", dest, "--runtime-env-json", runtime_env,
        "--", "python", "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    assert kube.commands() == [
        ["python", "-c", QUERY_SCRIPT, DASHBOARD, "get", "finetune-7"],  # is the id free?
        upload_command(dest, head.upload_sizes[dest]),
        submit_argv,
        ["rm", "-rf", "--", dest],
        ["python", "-c", QUERY_SCRIPT, DASHBOARD, "get", "finetune-7"],  # how did it end?
    ]
    assert {(call.pod, call.container, call.namespace) for call in kube.execs} == {(HEAD, "ray-head", "ray")}
    # The tar stream: the files, the empty directory, nothing excluded.
    assert sorted(head.uploads[dest]) == ["configs/", "configs/base.yaml", "empty/", "pkg/", "pkg/model.py", "train.py"]
    assert head.uploads[dest]["pkg/model.py"] == b"WIDTH = 1536\n"
    assert len(kube.execs[1].stdin) == head.upload_sizes[dest]
    assert (kube.execs[1].stdin_requested, kube.execs[1].stdin_closed) == (True, False)  # v4: head -c ends it
    assert not any(call.stdin_requested for call in kube.execs if call is not kube.execs[1])
    assert head.jobs["finetune-7"].runtime_env == json.loads(runtime_env)
    assert head.removed == [dest]
    # The job's output reached stdout; progress went to stderr.
    assert "step 1/2 loss=2.31\nstep 2/2 loss=1.87\n" in out
    assert "trainctl:" not in out
    assert f"head pod ray/{HEAD}" in err
    assert "job finetune-7 SUCCEEDED" in err
    assert kube.authorizations() == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [("SUCCEEDED", ExitCode.OK), ("FAILED", ExitCode.CHECK_FAILED), ("STOPPED", ExitCode.CHECK_FAILED)],
)
def test_exit_code_is_the_jobs_final_state(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys, outcome: str, expected: ExitCode
) -> None:
    head.outcome = outcome
    code, _out, err = run(capsys, kubeconfig, "--", "python", "-m", "training.ray_finetune", "--steps", "2")
    assert code == expected
    (job,) = head.jobs.values()
    assert job.submission_id.startswith("trainctl-")
    assert f"job {job.submission_id} {outcome}" in err
    if outcome == "FAILED":
        assert "Job entrypoint command failed with exit code 1" in err
    # Without --working-dir nothing is copied and ray job submit gets no --working-dir.
    assert [c[:3] for c in kube.commands()] == [["ray", "job", "submit"], ["python", "-c", QUERY_SCRIPT]]
    assert "--working-dir" not in kube.commands()[0]
    assert kube.commands()[0][-6:] == ["--", "python", "-m", "training.ray_finetune", "--steps", "2"]


def test_no_wait_prints_only_the_submission_id(kube: FakeKube, head: FakeRayHead, kubeconfig: Path, capsys) -> None:
    code, out, err = run(capsys, kubeconfig, "--no-wait", "--submission-id", "quick-1", "--", "python", "x.py")
    assert code == ExitCode.OK
    assert out == "quick-1\n"
    assert "submitted successfully" in err  # Ray's own output goes to stderr with --no-wait
    assert kube.commands()[-1] == [
        "ray", "job", "submit", "--address", DASHBOARD, "--submission-id", "quick-1", "--entrypoint-num-cpus", "1",
        "--no-wait",
        "--", "python", "x.py",
    ]  # fmt: skip
    assert head.jobs["quick-1"].status == "PENDING"


def test_output_is_streamed_as_it_arrives_not_at_the_end(kube: FakeKube, head: FakeRayHead, kubeconfig: Path) -> None:
    """The fake holds the job after its first line until that line has reached our stdout."""
    seen_first = threading.Event()
    held: list[bool] = []

    class Watch(io.StringIO):
        def write(self, text: str) -> int:
            written = super().write(text)
            if "step 1/2" in self.getvalue():
                seen_first.set()
            return written

    def hold(index: int) -> None:
        if index == 0:
            held.append(seen_first.wait(timeout=5))

    head.between_lines = hold
    out, err = Watch(), io.StringIO()
    api = api_client_from_kubeconfig(kubeconfig, None)
    try:
        code = submit(
            Target(api, "ray", "training", "test"),
            SubmitRequest(entrypoint=("python", "train.py"), submission_id="stream-1", id_given=False),
            progress=Progress(err),
            out=out,
            err=err,
        )
    finally:
        api.close()
    assert held == [True], "the first line reached stdout only after the job had ended"
    assert code == ExitCode.OK
    assert out.getvalue().index("step 1/2") < out.getvalue().index("step 2/2")


# --- the head pod -------------------------------------------------------------------------------


def test_head_pod_is_the_running_one_of_the_chosen_cluster(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    kube.add_pod("training-head-old", labels=HEAD_LABELS, terminating=True)
    kube.add_pod("training-head-new", labels=HEAD_LABELS)
    kube.add_pod("training-head-pending", labels=HEAD_LABELS, phase="Pending")
    kube.add_pod("qwen-head", labels={**HEAD_LABELS, "ray.io/cluster": "qwen-finetune-abcde"})
    ray = FakeRayHead(kube)
    code, _, err = run(capsys, kubeconfig, "--no-wait", "--", "python", "x.py")
    assert code == ExitCode.OK, err
    assert {call.pod for call in kube.execs} == {"training-head-new"}
    pod_lists = [r for r in kube.requests if r.path == "/api/v1/namespaces/ray/pods"]
    assert pod_lists[0].query["labelSelector"] == ["ray.io/node-type=head,ray.io/cluster=training"]

    code, _, err = run(capsys, kubeconfig, "--ray-cluster", "qwen-finetune-abcde", "--no-wait", "--", "python", "x.py")
    assert code == ExitCode.OK, err
    assert kube.execs[-1].pod == "qwen-head"
    assert len(ray.jobs) == 2


def test_no_running_head_pod_is_a_clear_error(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    kube.add_pod("training-head-pending", labels=HEAD_LABELS, phase="Pending", node="")
    code, out, err = run(capsys, kubeconfig, "--", "python", "x.py")
    assert code == ExitCode.ERROR
    assert out == ""
    assert "error: no Running Ray head pod in namespace ray (-l ray.io/node-type=head,ray.io/cluster=training)" in err
    assert "training-head-pending (Pending" in err
    assert "kubectl get raycluster -n ray" in err
    assert kube.execs == []


def test_no_head_pod_at_all_is_a_clear_error(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    code, _, err = run(capsys, kubeconfig, "--namespace", "training", "--", "python", "x.py")
    assert code == ExitCode.ERROR
    assert "no Running Ray head pod in namespace training" in err
    assert "found:" not in err


def test_several_running_head_pods_are_listed(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    kube.add_pod("training-head-a", labels=HEAD_LABELS, node="node-a")
    kube.add_pod("qwen-head", labels={**HEAD_LABELS, "ray.io/cluster": "qwen-finetune-abcde"}, node="node-b")
    code, _, err = run(capsys, kubeconfig, "--ray-cluster", "", "--", "python", "x.py")
    assert code == ExitCode.ERROR
    assert "2 Running Ray head pods in namespace ray (-l ray.io/node-type=head)" in err
    assert "qwen-head (Running, cluster qwen-finetune-abcde, node node-b)" in err
    assert "training-head-a (Running, cluster training, node node-a)" in err
    assert "--ray-cluster NAME" in err
    assert kube.execs == []


# --- refusals and failures ------------------------------------------------------------------------


def test_a_taken_submission_id_is_refused_before_anything_runs(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, workdir: Path, capsys
) -> None:
    head.add_job("finetune-7", "RUNNING")
    code, _, err = run(capsys, kubeconfig, "--working-dir", str(workdir), "--submission-id", "finetune-7", "--", "x")
    assert code == ExitCode.ERROR
    assert "submission id finetune-7 is taken on this Ray cluster (a job that is RUNNING)" in err
    assert [c[:2] for c in kube.commands()] == [["python", "-c"]]
    assert head.uploads == {}


def test_a_submission_ray_refuses_exits_2_with_rays_reason(
    kube: FakeKube, head: FakeRayHead, kubeconfig: Path, workdir: Path, capsys
) -> None:
    head.submit_fails = "ConnectionError: Failed to connect to Ray at address: http://localhost:8265."
    code, _, err = run(capsys, kubeconfig, "--working-dir", str(workdir), "--submission-id", "s-1", "--", "x")
    assert code == ExitCode.ERROR
    assert "error: job s-1 was not submitted: `ray job submit` exited 1 (ConnectionError: Failed to connect" in err
    assert head.removed == ["/tmp/trainctl/s-1"]  # the upload is cleaned up all the same


def test_a_command_that_cannot_start_in_the_pod_is_reported(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    kube.add_pod(HEAD, labels=HEAD_LABELS)
    kube.on_exec(["ray"], lambda session: Failure('exec: "ray": executable file not found in $PATH'))
    kube.on_exec(["python"], reply(stdout='TRAINCTL-JSON {"job": null}\n'))
    code, _, err = run(capsys, kubeconfig, "--no-wait", "--submission-id", "s-2", "--", "x")
    assert code == ExitCode.ERROR
    assert "executable file not found in $PATH" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("working_dir: /data/exp\npip: [numpy]\n", "sets working_dir: remove it and pass --working-dir DIR"),
        ("- pip\n- numpy\n", "expected a mapping of runtime_env fields"),
        ("env_vars:\n  OMP_NUM_THREADS: 4\n", "env_vars must map names to strings"),
        ("py_modules: [./lib]\n", "py_modules ['./lib'] are local paths"),
        ("pip: [numpy\n", "neither YAML nor JSON"),
        ("created: 2026-01-01\n", "not expressible as JSON"),
    ],
)
def test_bad_runtime_env_files_are_refused_before_connecting(
    kube: FakeKube, kubeconfig: Path, tmp_path: Path, capsys, text: str, message: str
) -> None:
    env_file = tmp_path / "env.yaml"
    env_file.write_text(text)
    code, _, err = run(capsys, kubeconfig, "--runtime-env", str(env_file), "--", "python", "x.py")
    assert code == ExitCode.ERROR
    assert message in err
    assert kube.requests == []


def test_runtime_env_as_json_is_accepted(tmp_path: Path) -> None:
    env_file = tmp_path / "env.json"
    env_file.write_text('{"pip": ["numpy==2.4.6"], "py_modules": ["s3://bucket/lib.zip"], "env_vars": {"A": "1"}}')
    assert load_runtime_env(env_file) == {
        "pip": ["numpy==2.4.6"],
        "py_modules": ["s3://bucket/lib.zip"],
        "env_vars": {"A": "1"},
    }


def test_a_working_dir_over_the_limit_is_refused_with_its_largest_parts(
    kube: FakeKube, kubeconfig: Path, workdir: Path, capsys
) -> None:
    (workdir / "data" / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    code, _, err = run(capsys, kubeconfig, "--working-dir", str(workdir), "--max-upload-mib", "1", "--", "x")
    assert code == ExitCode.ERROR
    assert "over the limit of 1.0 MiB (largest: data (2.0 MiB)" in err
    assert "--exclude NAME" in err
    assert kube.requests == []
    # Excluding the data makes it fit.
    archive = pack_working_dir(workdir, excludes=(".git", "__pycache__", ".venv", "data"), limit_bytes=1024 * 1024)
    archive.close()
    assert archive.files == 3


def test_bad_arguments_exit_2(kube: FakeKube, kubeconfig: Path, capsys) -> None:
    code, _, err = run(capsys, kubeconfig)
    assert code == ExitCode.ERROR
    assert "no entrypoint" in err
    code, _, err = run(capsys, kubeconfig, "--submission-id", "../etc", "--", "x")
    assert code == ExitCode.ERROR
    assert "--submission-id '../etc'" in err
    code, _, err = run(capsys, kubeconfig, "--working-dir", "/nonexistent/dir", "--", "x")
    assert code == ExitCode.ERROR
    assert "is not a directory" in err
    assert kube.requests == []


# --- the exec stream and the tar it carries -------------------------------------------------------


def test_v5_protocol_closes_stdin_after_the_archive(kubeconfig: Path, workdir: Path, tmp_path: Path, capsys) -> None:
    kube = FakeKube(subprotocol=V5).start()
    try:
        kube.add_pod(HEAD, labels=HEAD_LABELS)
        head = FakeRayHead(kube)
        config = write_kubeconfig(tmp_path / "kubeconfig-v5", kube.url)
        code, _, err = run(capsys, config, "--working-dir", str(workdir), "--no-wait", "--", "python", "train.py")
    finally:
        kube.stop()
    assert code == ExitCode.OK, err
    upload = kube.execs[0]
    assert (upload.protocol, upload.stdin_requested, upload.stdin_closed) == (V5, True, True)
    assert kube.execs[1].stdin_closed is False  # ray job submit gets no stdin
    assert "train.py" in next(iter(head.uploads.values()))


def test_upload_script_unpacks_exactly_the_archive_with_sh_head_and_tar(workdir: Path, tmp_path: Path) -> None:
    """The command the head pod runs, run here: head -c ends stdin after the archive (v4 cannot close it)."""
    archive = pack_working_dir(workdir)
    try:
        data = archive.file.read()
    finally:
        archive.close()
    dest = tmp_path / "pod" / "tmp" / "trainctl" / "job-1"
    dest.mkdir(parents=True)
    (dest / "stale.txt").write_text("from an earlier upload")
    command = upload_command(str(dest), len(data))
    assert command[:3] == ["sh", "-c", UPLOAD_SCRIPT]
    # Trailing bytes after the archive must not be read (head -c): tar would choke on them.
    finished = subprocess.run(command, input=data + b"garbage after the archive", capture_output=True, timeout=20)
    assert finished.returncode == 0, finished.stderr
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert files == [
        "configs",
        "configs/base.yaml",
        "data",
        "data/shard-0.bin",
        "empty",
        "pkg",
        "pkg/model.py",
        "train.py",
    ]
    assert (dest / "train.py").read_text() == "print('training')\n"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert {m.uid for m in tar.getmembers()} == {0}
        assert {m.uname for m in tar.getmembers()} == {""}


def test_upload_script_with_a_truncated_archive_fails(workdir: Path, tmp_path: Path) -> None:
    archive = pack_working_dir(workdir)
    try:
        data = archive.file.read()
    finally:
        archive.close()
    command = upload_command(str(tmp_path / "dest"), len(data))
    finished = subprocess.run(command, input=data[: len(data) // 2], capture_output=True, timeout=20)
    assert finished.returncode != 0, shlex.join(command)


def test_exec_reports_silence_and_keeps_the_stream_alive(kube: FakeKube, kubeconfig: Path) -> None:
    """A quiet job: the idle callback says it is still waiting, and pings keep load balancers from cutting it."""

    idle: list[tuple[float, float]] = []

    def quiet(session: ExecSession) -> int:
        # Silent until the client has reported the silence (at most 10 s: on a loaded machine a fixed 1.2 s was
        # sometimes too short for the 0.2 s timers), then 1 s more for its pings (the server counts them once the
        # handler returns and it reads the frames).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not idle:
            time.sleep(0.05)
        time.sleep(1.0)
        session.stdout("done\n")
        return 3

    kube.add_pod(HEAD, labels=HEAD_LABELS)
    kube.on_exec(["sleep"], quiet)
    api = api_client_from_kubeconfig(kubeconfig, None)
    try:
        pod = find_head_pod(api, "ray", "training", timeout=5)
        result = exec_in_pod(
            api, pod, ["sleep", "1"], on_idle=lambda *times: idle.append(times), idle_s=0.2, keepalive_s=0.2
        )
    finally:
        api.close()
    assert (result.exit_code, result.stdout) == (3, b"done\n")
    assert "exit status 3" in result.message
    assert idle
    assert all(elapsed >= silent >= 0.2 for elapsed, silent in idle)
    # The server counts the pings while it closes the stream, which can end after the client has returned.
    assert kube.execs[0].ended.wait(5)
    assert kube.execs[0].pings >= 1


def test_exec_refused_by_the_api_server_says_why(kube: FakeKube, kubeconfig: Path) -> None:
    kube.add_pod(HEAD, labels=HEAD_LABELS)
    api = api_client_from_kubeconfig(kubeconfig, None)
    try:
        pod = find_head_pod(api, "ray", "training", timeout=5)
        gone = dataclasses.replace(pod, name="training-head-gone")
        with pytest.raises(KubeError, match=r'exec in pod ray/training-head-gone: 404 Not Found \(pods "training-'):
            exec_in_pod(api, gone, ["true"])
        kube.accepted_tokens = {"another-token"}
        with pytest.raises(KubeError, match=r"401 Unauthorized .*access entries \(ClusterConfig.admin_principals\)"):
            exec_in_pod(api, pod, ["true"])
    finally:
        api.close()
    assert [call.pod for call in kube.execs] == []  # neither got past the handshake


def test_progress_durations_and_idle_lines() -> None:
    stream = io.StringIO()
    Progress(stream).idle("job x")(754.0, 61.0)
    assert stream.getvalue() == "trainctl: still waiting for job x (12m34s; no output for 1m01s)\n"
    assert [duration(s) for s in (1.24, 42.0, 3 * 3600 + 420)] == ["1.2s", "42s", "3h07m"]


def test_defaults_match_the_ray_cluster_chart() -> None:
    """--ray-cluster and --namespace default to the RayCluster k8s/charts/ray.py deploys; its Ray containers
    come first in their pods (exec and logs use the first container)."""
    chart = RayClusterChart(cdk8s.Testing.app(), "rc", environment=ENVIRONMENTS["dev"], lock=CHART_LOCK)
    (cluster,) = [o for o in cdk8s.Testing.synth(chart) if o["kind"] == "RayCluster"]  # beside its NetworkPolicies
    assert (cluster["metadata"]["name"], cluster["metadata"]["namespace"]) == (RAY_CLUSTER, "ray")
    head_container = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "dashboard", "containerPort": 8265} in head_container["ports"]
    assert DASHBOARD == "http://localhost:8265"
    assert [g["template"]["spec"]["containers"][0]["name"] for g in cluster["spec"]["workerGroupSpecs"]] == [
        "ray-worker"
    ]


def test_working_dir_must_exist(tmp_path: Path) -> None:
    with pytest.raises(WorkingDirError, match="is not a directory"):
        pack_working_dir(tmp_path / "missing")


# Parses (never runs) command lines with the click commands of the pinned Ray's own `ray job` CLI.
RAY_CLI_PARSE = """
import json, sys
from ray.dashboard.modules.job import cli
parsed = []
for argv in json.loads(sys.argv[1]):
    command = {"submit": cli.submit, "logs": cli.logs}[argv[2]]
    context = command.make_context("ray job " + argv[2], list(argv[3:]))
    parsed.append({k: v for k, v in context.params.items() if v not in (None, False, ())})
print(json.dumps(parsed))
"""


def test_ray_job_command_lines_parse_with_the_pinned_ray_cli() -> None:
    entrypoint = ["python", "train.py", "--lr", "3e-4", "--", "--not-an-option-of-ray"]
    argvs = [
        submit_command("s-1", entrypoint, working_dir="/tmp/trainctl/s-1", runtime_env={"pip": ["a==1"]}, no_wait=True),
        submit_command("s-2", ["python", "x.py"]),
        logs_command("s-1", follow=True),
    ]
    finished = subprocess.run(
        [sys.executable, "-c", RAY_CLI_PARSE, json.dumps(argvs)], capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    first, second, logs = json.loads(finished.stdout)
    assert {k: first[k] for k in ("address", "submission_id", "working_dir", "runtime_env_json", "no_wait")} == {
        "address": "http://localhost:8265",
        "submission_id": "s-1",
        "working_dir": "/tmp/trainctl/s-1",
        "runtime_env_json": '{"pip":["a==1"]}',
        "no_wait": True,
    }
    assert first["entrypoint"] == entrypoint
    # The driver off the claim-less head, on a worker (k8s/ray_spec.py head_group).
    assert first["entrypoint_num_cpus"] == second["entrypoint_num_cpus"] == 1
    assert "working_dir" not in second
    assert "no_wait" not in second
    assert second["entrypoint"] == ["python", "x.py"]
    assert (logs["job_id"], logs["follow"], logs["address"]) == ("s-1", True, "http://localhost:8265")

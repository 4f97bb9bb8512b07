"""`trainctl rehearse` as a user runs it (a subprocess): valid input kubectl accepts runs (issue 27 finding 6),
`--skip-unsupported` never exits 0 (finding 5), Ctrl-C stops every pod and exits 130 without a traceback,
and the README's rehearsal command, which loses pod 1 and then pod 0 of the NVRx job, completes (finding 9).

Fixtures are written here after the Kubernetes 1.36 documentation's Job examples (concepts/workloads/
controllers/job: a Job with restartPolicy Never and one short container) and kubectl's List handling
(`kubectl apply -f` of a `kind: List`, a directory, `metadata.generateName`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
ROOT = Path(__file__).resolve().parents[2]


def job(name: str, code: str = "print('done')", generate: bool = False) -> dict[str, Any]:
    meta = {"generateName": f"{name}-"} if generate else {"name": name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", code]}],
                }
            },
        },
    }


def trainctl(
    *argv: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", "rehearse", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_directory_with_a_list_and_generate_name_runs_with_a_relative_output_dir(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    listed = {"apiVersion": "v1", "kind": "List", "items": [job("listed"), job("gen", generate=True)]}
    (manifests / "list.yaml").write_text(yaml.safe_dump(listed))
    (manifests / "plain.yml").write_text(yaml.safe_dump(job("plain")))
    result = trainctl("manifests", "--output-dir", "out", "--pod-backoff", "0", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Traceback" not in out
    generated = re.search(r"named Job/(gen-[bcdfghjklmnpqrstvwxz2456789]{5}) from generateName gen-", out)
    assert generated, out
    for name in ("listed", generated.group(1), "plain"):
        assert re.search(rf"Job/{name} \(default\): Complete", out), out
    assert (tmp_path / "out" / "pods").is_dir()


def test_skip_unsupported_runs_the_rest_lists_skipped_and_exits_3(tmp_path: Path) -> None:
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "ddp"}, "spec": {}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump_all([job("runs"), pytorchjob]))
    result = trainctl("m.yaml", "--skip-unsupported", "--pod-backoff", "0", cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "SKIPPED PyTorchJob/ddp: kind PyTorchJob is not run" in out
    assert "Job/runs (default): Complete" in out


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ctrl_c_stops_every_pod_prints_what_ran_and_exits_130(tmp_path: Path) -> None:
    marker = f"rehearsal-sigint-{os.getpid()}"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(job("sleeper", f"import time; time.sleep(300)  # {marker}")))
    process = subprocess.Popen(
        [sys.executable, "-m", "trainctl", "rehearse", "m.yaml", "--output-dir", "out"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal starts it: SIGINT at its default (a shell's background job inherits it ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_with(marker), "the pod's container never started"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert "KeyboardInterrupt" not in stdout + stderr
    assert "interrupted (Ctrl-C) after" in stdout
    assert "every pod was stopped; 1 pod(s) ran" in stdout
    assert re.search(r"sleeper-\w{5}  stopped by Ctrl-C", stdout), stdout
    time.sleep(1)
    assert _processes_with(marker) == [], "a pod's process outlived the interrupted rehearsal"


def readme_rehearsal_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"`(trainctl rehearse dist/dev/[^`]+)`", readme)
    assert match, "README.md has no `trainctl rehearse dist/dev/...` command"
    return shlex.split(match.group(1))


def test_the_readme_rehearsal_command_loses_pod_1_then_pod_0_and_the_job_resumes_from_the_claim(
    dist: Path, tmp_path: Path
) -> None:
    """The README's command as written, which is also the CI's pod-loss rehearsal of the NVRx chart (dev, its FSx
    claim): pod 1 lost after the step-2 checkpoint is replaced without counting (DisruptionTarget, the Job's Ignore
    rule); pod 0 lost after step 4 takes the c10d store with it, so pod 1's launcher fails on a healthy node and that
    one failure counts against backoffLimit; the job completes, resuming from the claim both times."""
    argv = readme_rehearsal_command()
    assert {"--scale", "--ranks-per-pod"} <= set(argv), argv
    (tmp_path / "dist").symlink_to(dist)
    result = trainctl(*argv[2:], cwd=tmp_path, timeout=900, env={"TMPDIR": str(tmp_path)})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "Job/nvrx-fsdp (training): Complete" in out
    assert "--scale small set --model" in out
    assert "--ranks-per-pod 1 set --nproc-per-node 4 -> 1" in out, out[-6000:]
    rows = re.findall(r"^\s*(nvrx-fsdp-\d-\w+)\s.*?\s(Succeeded|Failed)(/DisruptionTarget)?\s", result.stdout, re.M)
    assert rows, result.stdout[-6000:]
    lost = [pod for pod, phase, disruption in rows if disruption]
    counted = [pod for pod, phase, disruption in rows if phase == "Failed" and not disruption]
    succeeded = sorted(pod[: len("nvrx-fsdp-0")] for pod, phase, _ in rows if phase == "Succeeded")
    # Pod 1 first, then pod 0, each lost as its node is; pod 0's loss cost pod 1 one counted failure.
    killed = re.findall(r"^note: killed pod (nvrx-fsdp-\d-\w+) at ", result.stdout, re.M)
    assert [pod[: len("nvrx-fsdp-0")] for pod in killed] == ["nvrx-fsdp-1", "nvrx-fsdp-0"], result.stdout[-6000:]
    assert sorted(lost) == sorted(killed)
    assert [pod[: len("nvrx-fsdp-0")] for pod in counted] == ["nvrx-fsdp-1"], result.stdout[-6000:]
    assert succeeded == ["nvrx-fsdp-0", "nvrx-fsdp-1"]
    (logs,) = re.findall(r"logs under (\S+)/pods/", result.stdout)
    report = json.loads((Path(logs) / "claims/training/checkpoints/nvrx-fsdp/metrics.json").read_text())
    # A fresh start, then a resume from the step-2 checkpoint on the claim, then from the newest one committed when
    # pod 0 went: step 4's, or step 6's where the writer committed 4 within a tick of 6 (steps take ~50 ms here, the
    # async commit of 4 can land as step 6 is saved, and the rehearsal acts on a 0.1 s tick); one rank per pod.
    resumed = [r["step"] for r in report["resumes"]]
    assert resumed[0] == 0, report["resumes"]
    assert resumed[-1] in (4, 6), report["resumes"]
    assert 2 in resumed, report["resumes"]
    committed = {s["step"] for s in report["saves"] if s["committed"]}
    assert set(resumed[1:]) <= committed, report["saves"]
    assert report["step_times"][-1]["step"] == 6
    assert report["world_size"] == 2

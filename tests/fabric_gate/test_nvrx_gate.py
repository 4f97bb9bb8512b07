"""The gate in the NVRx job's own process chain, on CPU: the pod's supervisor over ft_launcher over
training.nvrx_fsdp, a fault injected at the gate (CPU rehearsal only). The gate fails before the model is built,
every rank leaves with the gate's code (os._exit, past the in-process Wrapper), the supervisor stops ft_launcher
instead of letting it restart the workers into the same verdict, and the pod exits with the code the Job's
podFailurePolicy reads: 75 (retry elsewhere: the remediation controller took the node out) the first time, 76 (fail
the Job) once the run's failures are spent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.fabric_controller.objects_api import ObjectsApi
from tests.tiers import starts_training_processes
from training.fabric_gate import EXIT_FAILED, EXIT_RETRY

ROOT = Path(__file__).resolve().parents[2]


@starts_training_processes
def pod(tmp: Path, inject: str, api_url: str) -> subprocess.CompletedProcess[str]:
    launcher = Path(sys.executable).with_name("ft_launcher")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PLATFORM_REHEARSAL": "cpu",
        "FABRIC_GATE_INJECT": inject,
        "NODE_NAME": "node-0",
        "POD_NAME": "gated-node-0",
        "POD_UID": "uid-gated-node-0",
        "POD_NAMESPACE": "training",
        "FABRIC_GATE_API_URL": api_url,
        "FABRIC_GATE_POD_DIR": str(tmp / "pod"),
        "FABRIC_GATE_TERMINATION_LOG": str(tmp / "termination-log"),
        "FABRIC_GATE_RUN_ID": "run-1",
        "PLATFORM_EMF_CONTAINER_LOG": "",
    }
    argv = [
        sys.executable, "-m", "training.fabric_gate", "supervise", "--",
        str(launcher), "--standalone", "--nproc-per-node=2", "--max-restarts=3", "--monitor-interval=1",
        "-m", "training.nvrx_fsdp", "--model=not-loaded-before-the-gate", f"--ckpt-dir={tmp / 'ckpt'}",
        "--device=cpu", "--steps=2",
        "--fabric-gate", "--fabric-gate-floor-gbps=350.2", "--fabric-gate-message-bytes=2147483648",
        "--fabric-gate-instance-type=p5.48xlarge", f"--fabric-gate-state-dir={tmp / 'ckpt' / 'fabric-gate'}",
        "--fabric-gate-workload=Job/nvrx-fsdp", "--fabric-gate-run-seconds=86400",
    ]  # fmt: skip
    # As in a pod, whatever the supervisor leaves behind ends with it: a process ft_launcher started and did not stop
    # (its rank monitors) kept the output pipes open after the supervisor had exited 76, and a run that read them to
    # the end waited 180 s (seen once in a make test). The output goes to files; the process group is killed after.
    out, err = tmp / f"supervisor-{inject}.out", tmp / f"supervisor-{inject}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, text=True, start_new_session=True)
        try:
            code = process.wait(timeout=180)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


def test_a_failed_gate_exits_the_pod_with_the_gates_code_not_ft_launchers(
    tmp_path: Path, controlled: ObjectsApi
) -> None:
    first = pod(tmp_path, "fallback:node-0", controlled.url)
    assert first.returncode == EXIT_RETRY, first.stdout[-3000:] + first.stderr[-3000:]
    verdict = json.loads((tmp_path / "pod" / "verdict.json").read_text())
    assert verdict["outcome"] == "FAIL"
    assert verdict["suspects"] == ["node-0"]
    assert (tmp_path / "termination-log").read_text().startswith("FABRIC GATE FAIL")
    # ft_launcher never restarted the workers into the verdict: one gate run of each rank.
    assert first.stdout.count("FABRIC GATE FAIL") == 1
    assert "restart" not in first.stdout.lower().split("fabric gate fail")[0]
    second = pod(tmp_path, "fallback:node-0", controlled.url)
    assert second.returncode == EXIT_FAILED, second.stdout[-3000:] + second.stderr[-3000:]

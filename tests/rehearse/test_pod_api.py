"""Pod-level behaviour only real processes show (issue 27 findings 3 and 8): native sidecars, a missing
executable as StartError, termination messages. Fixtures written from the Kubernetes 1.36 docs
(concepts/workloads/pods/sidecar-containers and the Job-with-sidecar example shape: a log-forwarding sidecar
that never exits beside a main container that finishes; tasks/debug/debug-application/
determine-reason-pod-failure: terminationMessagePath, FallbackToLogsOnError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rehearse import format_table
from tests.rehearse.test_harness import job, python_container, rehearse

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]


def test_a_native_sidecar_starts_first_keeps_running_and_is_stopped_after_the_main_container(tmp_path: Path) -> None:
    obj = job(
        "with-sidecar",
        """
        import os, time
        # The sidecar started before this container and is still running.
        for _ in range(50):
            if os.path.exists("/shared/sidecar-up"):
                break
            time.sleep(0.1)
        print("sidecar up:", os.path.exists("/shared/sidecar-up"))
        open("/shared/log.txt", "w").write("hello\\n")
        time.sleep(2)  # tail -F looks for the file once a second
        """,
        volumes=[{"name": "shared", "emptyDir": {}}],
        mounts=[{"name": "shared", "mountPath": "/shared"}],
    )
    pod = obj["spec"]["template"]["spec"]
    pod["initContainers"] = [
        {
            "name": "forwarder",
            "image": "example.invalid/forwarder:1",
            "restartPolicy": "Always",
            "command": ["/bin/sh", "-c", "touch /shared/sidecar-up; exec tail -F /shared/log.txt"],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }
    ]
    pod["terminationGracePeriodSeconds"] = 5
    w = rehearse(tmp_path, obj, timeout_s=40.0).workload("with-sidecar")
    assert w.state == "Complete", (w.message, [(p.exit_codes, p.reasons) for p in w.pods])
    p = w.pods[0]
    assert "sidecar up: True" in p.log("main")
    assert p.exit_codes["main"] == 0
    # Stopped with SIGTERM once main ended; its exit code does not make the pod fail.
    assert p.exit_codes["forwarder"] == 143
    assert p.phase == "Succeeded"
    assert "hello" in p.log("forwarder")
    assert w.wall_s < 20


def test_a_missing_executable_is_a_start_error_128_with_the_message_in_the_summary(tmp_path: Path) -> None:
    obj = job("typo", "")
    obj["spec"]["template"]["spec"]["containers"] = [
        python_container("print(1)", command=["pyhton3", "-c", "print(1)"]),
    ]
    result = rehearse(tmp_path, obj)
    w = result.workload("typo")
    assert w.state == "Failed"
    p = w.pods[0]
    assert (p.exit_codes["main"], p.reasons["main"]) == (128, "StartError")
    assert 'exec: "pyhton3": executable file not found in $PATH' in p.messages["main"]
    table = format_table(result)
    assert "StartError: failed to create containerd task" in table, table
    assert '"pyhton3": executable file not found' in table, table


def test_termination_messages_from_the_file_and_from_the_log_on_error(tmp_path: Path) -> None:
    obj = job("messages", "")
    obj["spec"]["template"]["spec"]["containers"] = [
        python_container(
            "open('/dev/termination-log', 'w').write('wrote 42 rows')",
            name="writer",
        ),
        python_container(
            "import sys; print('loading', flush=True); print('config key missing: lr', file=sys.stderr); sys.exit(3)",
            name="crasher",
            terminationMessagePolicy="FallbackToLogsOnError",
        ),
        python_container(
            "open('/tmp/why', 'w').write('custom path'); raise SystemExit(0)",
            name="custom",
            terminationMessagePath="/tmp/why",
        ),
    ]
    result = rehearse(tmp_path, obj)
    p = result.workload("messages").pods[0]
    assert p.exit_codes == {"writer": 0, "crasher": 3, "custom": 0}
    assert p.messages["writer"] == "wrote 42 rows"
    assert p.messages["crasher"].strip().endswith("config key missing: lr")
    assert p.messages["custom"] == "custom path"
    assert "crasher: Error: loading" in format_table(result)
    # Each container had its own file; none was created on this machine's /dev.
    assert not Path("/dev/termination-log").exists()


def test_a_main_container_that_never_started_has_no_exit_code(tmp_path: Path) -> None:
    obj = job("init-fails", "print('never')")
    obj["spec"]["template"]["spec"]["initContainers"] = [python_container("raise SystemExit(4)", name="setup")]
    p = rehearse(tmp_path, obj).workload("init-fails").pods[0]
    assert p.exit_codes == {"setup": 4, "main": None}
    assert p.reasons["main"] == "PodInitializing"

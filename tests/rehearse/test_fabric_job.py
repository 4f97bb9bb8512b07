"""The fabric-check Job from the real fabric chart, rehearsed on CPU. The probe's all-reduce runs on gloo
there (training/rehearsal.py) and writes no NCCL lines, so the analyzer cannot see EFA: the check must
fail, saying so, never pass silently on CPU.

Message size: the chart makes the sweep reach the g6 floor's message size (256 MiB) whatever
FabricJobConfig.max_bytes says. On CPU each gloo rank then holds ~3 GB (the buffer, the expected result
and the check's copies); eight ranks on this 23 GiB machine met the kernel's OOM killer (dmesg: "Out of
memory: Killed process (python) anon-rss:2936016kB", rank 6 SIGKILLed, 145 s). So the small run patches
the floor's message size to 64 KiB for the chart, a test-only value like the tiny model elsewhere; the
floor in Gbps, the script, the env and the analyzer are the chart's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cdk8s
import pytest

import k8s.charts.fabric as fabric_chart
from infra.spec import ENVIRONMENTS
from k8s.charts.fabric import FabricJob, FabricJobConfig, FabricJobsChart
from k8s.images import ImageLock
from rehearse import Options, Rehearsal, load_manifests, run

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
SMALL_FLOOR_BYTES = 64 * 1024
NOT_ON_EFA = "FABRIC CHECK FAILED: NCCL is not running over EFA on {host}"
NO_NCCL_LINES = "UNKNOWN: no NCCL log lines in the input"


def small_fabric_check(lock: ImageLock, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setattr(fabric_chart, "floor_message_bytes", lambda _instance_type: SMALL_FLOOR_BYTES)
    config = FabricJobConfig(max_bytes=SMALL_FLOOR_BYTES, iters=2)
    app = cdk8s.App()
    chart = FabricJobsChart(
        app, "fabric-check", environment=ENVIRONMENTS["dev"], lock=lock, kind=FabricJob.CHECK, config=config
    )
    return chart.to_json()


def logs(result: Rehearsal) -> str:
    return "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for w in result.workloads for p in w.pods)


def test_fabric_check_on_cpu_fails_saying_nccl_is_not_on_efa(
    tmp_path: Path, dist: Path, lock: ImageLock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The training code exactly as `make synth` writes it (the dist fixture's file), the check Job from the chart.
    manifests = [*load_manifests([dist / "dev/training-code.k8s.yaml"]), *small_fabric_check(lock, monkeypatch)]
    script = next(m for m in manifests if m["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--max-bytes {SMALL_FLOOR_BYTES}" in script[-1]
    result = run(manifests, Options(output_dir=tmp_path / "out", timeout_s=300.0, backoff_base_s=1.0))
    check = result.workload("fabric-check-g6")
    # backoffLimit 0: the first pod whose check failed fails the Job; it is never Complete on CPU.
    assert (check.state, check.message.split(":")[0]) == ("Failed", "BackoffLimitExceeded"), logs(result)
    failed = [p for p in check.pods if p.exit_codes.get("probe") == 10]
    assert failed, logs(result)
    for pod in failed:
        # The analyzer's verdict and the script's line naming the pod: gloo writes no NCCL lines to judge.
        assert NO_NCCL_LINES in pod.log(), pod.log()
        assert NOT_ON_EFA.format(host=pod.hostname) in pod.log(), pod.log()
    # The probe itself ran the chart's sweep across both pods on gloo (rank 0, on pod 0, prints the table).
    rank0 = check.pod("fabric-check-g6-0").log()
    assert "# fabric_probe: all_reduce sum, backend gloo, world size 8, device cpu" in rank0, rank0
    assert "maxBytes 65536 (64 KiB)" in rank0
    assert not any("FABRIC CHECK PASSED" in p.log() for p in check.pods)
    assert check.pods[0].accelerators == {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}

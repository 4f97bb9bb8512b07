"""Fabric check and A/B jobs: one pod per node, the node's GPUs and EFA, the profiles, and the
exit behaviour written into the command."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cdk8s
import pytest

from gates.manifests import check_objects
from infra.spec import ENVIRONMENTS
from infra.spec.fabric_floors import floor_gbps, floor_message_bytes
from k8s.charts.fabric import FabricJob, FabricJobsChart
from k8s.fabric_env import FabricProfile, fabric_env
from k8s.images import ImageLock
from k8s.ray_spec import RAY_IMAGE
from tests.conftest import ROOT

DIGEST = "sha256:" + hashlib.sha256(b"fabric chart test image").hexdigest()
LOCK = ImageLock.load().with_digest("ray-train", DIGEST)


def _objects(env: str, kinds: tuple[FabricJob, ...] = tuple(FabricJob)) -> list[dict[str, Any]]:
    app = cdk8s.Testing.app()
    charts = [
        FabricJobsChart(app, f"f-{kind.value}", environment=ENVIRONMENTS[env], lock=LOCK, kind=kind) for kind in kinds
    ]
    return [dict(o) for chart in charts for o in cdk8s.Testing.synth(chart)]


@pytest.fixture(scope="module")
def prod() -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in _objects("prod")}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _script(job: dict[str, Any]) -> str:
    return str(_container(job)["command"][-1])


def test_a_check_and_an_ab_job_per_gpu_group_with_headless_services(prod: dict[str, dict[str, Any]]) -> None:
    for group in ("p5", "g6"):
        for kind in ("check", "ab"):
            name = f"fabric-{kind}-{group}"
            service = prod[f"Service/{name}"]["spec"]
            assert service["clusterIP"] == "None"
            assert service["selector"] == {"job-name": name}
            assert prod[f"Job/{name}"]["spec"]["template"]["spec"]["subdomain"] == name


def test_the_check_and_the_ab_job_are_separate_charts() -> None:
    # Issue 17 #5: both take every node of a two-node group; in one file, applying it deadlocks them.
    for kind, other in ((FabricJob.CHECK, "fabric-ab-"), (FabricJob.AB, "fabric-check-")):
        names = [o["metadata"]["name"] for o in _objects("prod", (kind,))]
        assert names
        assert not [n for n in names if n.startswith(other)], names


def test_every_object_passes_the_manifest_gate() -> None:
    for env in ("dev", "prod"):
        assert check_objects([(f"#{i}", o) for i, o in enumerate(_objects(env))]) == []


def test_two_indexed_pods_one_per_node(prod: dict[str, dict[str, Any]]) -> None:
    spec = prod["Job/fabric-check-p5"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimit"] == 0
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [
        {"labelSelector": {"matchLabels": {"job-name": "fabric-check-p5"}}, "topologyKey": "kubernetes.io/hostname"}
    ]


@pytest.mark.parametrize(("group", "gpus", "efa"), [("p5", "8", "32"), ("g6", "4", "1")])
def test_each_pod_takes_its_whole_node(prod: dict[str, dict[str, Any]], group: str, gpus: str, efa: str) -> None:
    job = prod[f"Job/fabric-check-{group}"]
    limits = _container(job)["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == (gpus, efa)
    assert _container(job)["resources"]["requests"] == limits
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-worker", "platform/gpu-group": group}
    assert f"--nproc-per-node={gpus}" in _script(job)


def test_check_runs_the_efa_profile_with_the_floor_and_the_analyzer(prod: dict[str, dict[str, Any]]) -> None:
    for group, instance in (("p5", "p5.48xlarge"), ("g6", "g6.12xlarge")):
        job = prod[f"Job/fabric-check-{group}"]
        env = {e["name"]: e["value"] for e in _container(job)["env"]}
        for key, value in fabric_env(ENVIRONMENTS["prod"].gpu_node_groups[0 if group == "p5" else 1].instance).items():
            assert env[key] == value
        script = _script(job)
        assert f"--floor-gbps {floor_gbps(instance):g}" in script
        assert f"--max-bytes {max(1 << 30, floor_message_bytes(instance))}" in script
        assert f"--master-addr=fabric-check-{group}-0.fabric-check-{group}.training.svc" in script
        assert "python -m training.fabric_analyzer /tmp/fabric/efa.log" in script
        assert "exit 10" in script  # not on EFA -> non-zero, whatever the bandwidth
        assert 'exit "$probe"' in script
        assert script.startswith("set -uo pipefail")


def test_ab_job_runs_both_profiles_and_the_ratio(prod: dict[str, dict[str, Any]]) -> None:
    script = _script(prod["Job/fabric-ab-g6"])
    tcp = fabric_env(ENVIRONMENTS["prod"].gpu_node_groups[1].instance, FabricProfile.TCP_BASELINE)
    assert script.count("training.fabric_probe") == 2
    assert "--floor-gbps" not in script  # the A/B measures, it does not judge
    assert f"NCCL_NET={tcp['NCCL_NET']!r}" in script
    assert "FI_PROVIDER='tcp'" in script
    assert "python -m training.fabric_compare /tmp/fabric/efa.json /tmp/fabric/tcp.json" in script
    # The container itself runs with the EFA profile; only the second sweep overrides it.
    env = {e["name"]: e["value"] for e in _container(prod["Job/fabric-ab-g6"])["env"]}
    assert env["NCCL_NET"] == "AWS Libfabric"


def test_check_script_fails_when_the_analyzer_does(tmp_path: Path) -> None:
    """Run the real check script's tail with stand-ins for torchrun: the exit codes hold."""
    job = _objects("dev")
    script = next(_script(o) for o in job if o["kind"] == "Job" and o["metadata"]["name"] == "fabric-check-g6")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text("#!/bin/sh\necho 'host:1:1 [0] NCCL INFO Using network Socket'\nexit 0\n")
    (fake / "torchrun").chmod(0o755)
    result = subprocess.run(
        ["/bin/bash", "-c", script.replace("/tmp/fabric", str(tmp_path / "out"))],
        env={
            "PATH": f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "JOB_COMPLETION_INDEX": "0",
            "PYTHONPATH": str(ROOT),
            # This machine is not the image: its Python, plugin and devices are not checked (as in a rehearsal).
            "PLATFORM_REHEARSAL": "cpu",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 10, result.stdout + result.stderr
    assert "FABRIC CHECK FAILED: NCCL is not running over EFA" in result.stdout


@pytest.mark.parametrize("kind", ["check", "ab"])
def test_fabric_pods_check_their_preconditions_before_the_probe(tmp_path: Path, kind: str) -> None:
    """The real script on this machine, which lacks the image's Python, the OFI plugin and EFA devices: the pod
    exits 2 naming what it lacks, and the probe never starts."""
    job = next(o for o in _objects("dev") if o["kind"] == "Job" and o["metadata"]["name"] == f"fabric-{kind}-g6")
    script = _script(job)
    image = LOCK.get(RAY_IMAGE).runtime
    assert image is not None
    wanted = f"--python {image.python} --package torch=={image.packages['torch']}"
    assert f"python -m training.pod_checks {wanted}" in script
    assert "--nccl-net-plugin ofi --efa-devices 1 --memlock unlimited" in script
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text(f"#!/bin/sh\ntouch {tmp_path}/probe-ran\n")
    (fake / "torchrun").chmod(0o755)
    result = subprocess.run(
        ["/bin/bash", "-c", script.replace("/tmp/fabric", str(tmp_path / "out"))],
        env={
            "PATH": f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "JOB_COMPLETION_INDEX": "0",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    # The script's `python` is this interpreter (PATH above): its check passes only where it is the image's Python.
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here == image.python:
        assert f"ok   python: Python {here}\n" in result.stdout
    else:
        assert f"FAIL python: Python {here}, the workload needs {image.python}" in result.stdout
    assert "FAIL efa devices" in result.stdout
    assert not (tmp_path / "probe-ran").exists()


def test_fabric_compare_prints_the_ratio(tmp_path: Path) -> None:
    report = {"large_message_bytes": 1 << 30, "world_size": 16}
    (tmp_path / "efa.json").write_text(json.dumps({**report, "large_message_busbw_gbps": 440.0}))
    (tmp_path / "tcp.json").write_text(json.dumps({**report, "large_message_busbw_gbps": 20.0}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.fabric_compare",
            str(tmp_path / "efa.json"),
            str(tmp_path / "tcp.json"),
            "--output-json",
            str(tmp_path / "ab.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "FABRIC A/B: efa 440.00 GB/s, tcp 20.00 GB/s, efa/tcp 22.00x" in result.stdout
    assert json.loads((tmp_path / "ab.json").read_text())["efa_over_tcp"] == 22.0


def test_fabric_compare_refuses_mismatched_sweeps(tmp_path: Path) -> None:
    (tmp_path / "efa.json").write_text(json.dumps({"large_message_bytes": 1 << 30, "large_message_busbw_gbps": 440.0}))
    (tmp_path / "tcp.json").write_text(json.dumps({"large_message_bytes": 1 << 20, "large_message_busbw_gbps": 2.0}))
    result = subprocess.run(
        [sys.executable, "-m", "training.fabric_compare", str(tmp_path / "efa.json"), str(tmp_path / "tcp.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "different sizes" in result.stderr

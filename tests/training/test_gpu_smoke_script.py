"""scripts/gpu_smoke.sh on a machine without a GPU: it has never run on one here. What can be checked is: the
script parses, every command it runs is accepted by the real parser of the module it runs (NVRx's ft_launcher,
torchrun, the training modules), it never reaches for a package index, it refuses to start (exit 2, naming what is
missing) without the machine's Python, a GPU or the carried wheels, and its table and JSON render from the files
its runs write."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser as ft_launcher_parser
from torch.distributed.run import get_args_parser as torchrun_parser

from tests.conftest import ROOT
from training import fabric_probe, nvrx_fsdp, ray_finetune
from training.nvrx_config import Job

SCRIPT = ROOT / "scripts/gpu_smoke.sh"
REPORT = ROOT / "scripts/gpu_smoke_report.py"
MACHINE_PYTHON = "/opt/torch/.venv/bin/python3"
FT_LAUNCHER = ["-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]


def test_the_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smoke")


@pytest.fixture(scope="module")
def commands(work: Path) -> dict[str, list[str]]:
    result = subprocess.run(
        [str(SCRIPT), "--print-commands"],
        env={"PATH": "/usr/bin:/bin", "GPU_SMOKE_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(line) for line in result.stdout.splitlines()]
    return {line[0]: line[1:] for line in lines}


def test_it_runs_five_commands_with_the_machines_python(commands: dict[str, list[str]]) -> None:
    assert list(commands) == ["nvrx-inprocess", "ft-sigkill", "nvrx-sync", "fabric", "ray"]
    assert {argv[0] for argv in commands.values()} == {MACHINE_PYTHON}


def ft_launch(argv: list[str]) -> tuple[object, Job]:
    assert argv[1:3] == FT_LAUNCHER
    launcher = ft_launcher_parser().parse_args(argv[3:])
    assert (launcher.module, launcher.training_script, launcher.standalone) == (True, "training.nvrx_fsdp", True)
    job, check_only = nvrx_fsdp.parse_command(launcher.training_script_args)
    assert not check_only
    assert job.device == "cuda"
    return launcher, job


def test_the_inprocess_run_uses_the_nvrx_async_saver_under_the_only_restart_policy_0_7_knows(
    commands: dict[str, list[str]],
) -> None:
    launcher, job = ft_launch(commands["nvrx-inprocess"])
    # NVRx 0.7.0 launcher.py: --ft-restart-policy accepts any-failed only (0.4.1's min-healthy exits 2); not written.
    assert not any(a.startswith("--ft-restart-policy") for a in commands["nvrx-inprocess"])
    assert vars(launcher)["ft_restart_policy"] == "any-failed"
    assert vars(launcher)["max_restarts"] == 0  # only the Wrapper may recover
    assert (job.ckpt_saver, job.ckpt_mode) == ("nvrx", "async")
    assert job.inprocess.enabled
    assert job.inprocess.max_iterations >= 2
    assert job.fault is not None
    assert job.fault.kind.value == "exception"
    assert job.steps > job.fault.step > job.ckpt_every  # a checkpoint exists before the fault


def test_the_sigkill_run_leaves_the_restart_to_ft_launcher(commands: dict[str, list[str]]) -> None:
    launcher, job = ft_launch(commands["ft-sigkill"])
    assert vars(launcher)["max_restarts"] >= 1
    assert not job.inprocess.enabled
    assert job.fault is not None
    assert job.fault.kind.value == "kill"
    assert job.fault.rank < int(vars(launcher)["nproc_per_node"])
    assert job.steps > job.fault.step > job.ckpt_every


def test_the_sync_run_is_the_same_loop_without_a_fault(commands: dict[str, list[str]]) -> None:
    _, sync = ft_launch(commands["nvrx-sync"])
    _, inprocess = ft_launch(commands["nvrx-inprocess"])
    assert sync.ckpt_mode == "sync"
    assert sync.fault is None
    same = ("model", "steps", "batch_size", "seq_len", "ckpt_every")
    assert [getattr(sync, f) for f in same] == [getattr(inprocess, f) for f in same]


def test_the_fabric_probe_runs_on_cuda(commands: dict[str, list[str]]) -> None:
    argv = commands["fabric"]
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    launcher = torchrun_parser().parse_args(argv[3:])
    assert (launcher.module, launcher.training_script) == (True, "training.fabric_probe")
    args = fabric_probe.parse_args(launcher.training_script_args)
    assert (args.device, args.max_bytes) == ("cuda", 256 << 20)
    assert args.output_json is not None


def test_the_ray_finetune_runs_on_gpus(commands: dict[str, list[str]]) -> None:
    argv = commands["ray"]
    assert argv[1:3] == ["-m", "training.ray_finetune"]
    args = ray_finetune.parse_args(argv[3:])
    assert args.use_gpu is True
    assert args.storage_path
    assert args.output_json


def test_the_report_reads_the_files_the_runs_write(commands: dict[str, list[str]], work: Path) -> None:
    report = _report_module()
    written = {}
    for name, argv in commands.items():
        (path,) = [a.split("=", 1)[1] for a in argv if a.startswith(("--metrics-file=", "--output-json="))]
        written[name] = Path(path).relative_to(work).as_posix()
    assert written == report.RUNS


def test_it_installs_only_the_carried_wheels_without_an_index() -> None:
    text = SCRIPT.read_text()
    installs = [line for line in text.replace("\\\n", " ").splitlines() if "-m pip install" in line]
    assert len(installs) == 1
    assert all(flag in installs[0] for flag in ("--no-index", "--no-deps", '--target "$site"'))
    assert not re.search(r"-m venv|pip download|https?://", text)


def refusal(work: Path, python: str, bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "--json", str(work / "out.json")],
        env={"PATH": "/usr/bin:/bin", "GPU_SMOKE_DIR": str(work), "GPU_SMOKE_PYTHON": python,
             "GPU_SMOKE_BUNDLE": str(bundle)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_it_refuses_to_start_without_the_python_and_the_wheels(tmp_path: Path) -> None:
    result = refusal(tmp_path, "/nonexistent/python3", tmp_path / "no-bundle")
    assert result.returncode == 2
    assert "refusing to start; missing:" in result.stderr
    assert "the machine's Python: /nonexistent/python3 is not an executable" in result.stderr
    assert f"no manifest.json and *.whl in {tmp_path / 'no-bundle'}" in result.stderr
    assert "make gpu-bundle" in result.stderr
    assert not (tmp_path / "out.json").exists()


def test_it_refuses_to_start_where_torch_sees_no_gpu(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"wheels": [{"name": "nvidia-resiliency-ext"}]}')
    (bundle / "nvidia_resiliency_ext-0.7.0-cp312-cp312-manylinux_2_39_x86_64.whl").write_bytes(b"")
    # This machine's Python and torch (CPU only): the wheels are there, the GPU is what is missing.
    result = refusal(tmp_path, sys.executable, bundle)
    assert result.returncode == 2
    import torch

    assert f"a CUDA GPU: torch {torch.__version__}" in result.stderr
    assert "0 GPU(s)" in result.stderr
    assert "carried wheels" not in result.stderr
    assert not (tmp_path / "site").exists()  # nothing installed


def _report_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke_report", REPORT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_and_json_come_from_the_runs_files(tmp_path: Path) -> None:
    def steps(seconds: list[float]) -> list[dict[str, float]]:
        return [{"step": i + 1, "seconds": s} for i, s in enumerate(seconds)]

    files = {
        "inprocess/metrics.json": {
            "step_times": steps([0.02, 0.04, 0.03]),
            "saves": [{"saver": "nvrx"}],
            "save_stall_s": {"median": 0.005},
            "recoveries": [{"recovered_by": "inprocess", "recovery_s": 2.5}],
        },
        "sigkill/metrics.json": {
            "step_times": steps([0.03]),
            "recoveries": [{"recovered_by": "ft_launcher", "recovery_s": 14.0}],
        },
        "sync/metrics.json": {"step_times": steps([0.05, 0.05]), "save_stall_s": {"median": 0.25}},
        "fabric.json": {"world_size": 1, "backend": "nccl", "peak_busbw_gbps": 0.0, "wrong_total": 0},
        # ray.json: absent (the Ray run failed)
    }
    for name, payload in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(payload))
    runs = tmp_path / "runs.tsv"
    runs.write_text(
        "nvrx-inprocess\tPASS\t40\nft-sigkill\tPASS\t55\nnvrx-sync\tPASS\t30\nfabric\tPASS\t12\n"
        "ray\tFAIL (exit 1)\t20\n"
    )
    torch_json = tmp_path / "torch.json"
    torch_json.write_text(json.dumps({"version": "2.11.0+cu130", "cuda": "13.0", "gpus": 1, "device": "NVIDIA H200",
                                      "python": MACHINE_PYTHON}))  # fmt: skip
    out = tmp_path / "out/gpu-smoke.json"
    done = subprocess.run(
        [sys.executable, str(REPORT), str(tmp_path), "--json", str(out), "--runs", str(runs), "--torch",
         str(torch_json), "--tokens-per-step", "512", "--total-s", "200"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["recovery_s"] == {"inprocess": 2.5, "ft_launcher": 14.0}
    assert result["save_stall_s"] == {"async": 0.005, "async_savers": ["nvrx"], "sync": 0.25}
    assert result["step_time_s"] == {"nvrx_async": 0.03, "nvrx_sync": 0.05, "ray": None}
    assert result["tokens_per_s"]["nvrx_sync"] == pytest.approx(512 / 0.05)
    assert result["runs"]["ray"] == {"result": "FAIL (exit 1)", "seconds": 20}
    lines = done.stdout.splitlines()
    assert lines[0] == f"GPU smoke: torch 2.11.0+cu130 (CUDA 13.0) from {MACHINE_PYTHON}, 1 x NVIDIA H200, 200 s in all"
    rows = {line.split()[0]: line for line in lines[2:7]}
    assert list(rows) == ["nvrx-inprocess", "ft-sigkill", "nvrx-sync", "fabric", "ray"]
    assert "2.50 in-process" in rows["nvrx-inprocess"]
    assert "0.0050 async" in rows["nvrx-inprocess"]
    assert "14.00 ft_launcher" in rows["ft-sigkill"]
    assert "0.2500 sync" in rows["nvrx-sync"]
    assert "10240" in rows["nvrx-sync"]
    assert "FAIL (exit 1)" in rows["ray"]

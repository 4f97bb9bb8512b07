"""scripts/gpu_smoke.sh on a machine without a GPU: it has never run on one here. What can be checked is: the
script parses, every command it runs is accepted by the real parsers of the modules it calls (torchrun's and the
training modules' own), the package pins it installs exist, and its result table renders."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser as torchrun_parser

from tests.conftest import ROOT
from training import fabric_probe, nvrx_fsdp, ray_finetune

SCRIPT = ROOT / "scripts/gpu_smoke.sh"


def test_the_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    work = tmp_path_factory.mktemp("smoke")
    result = subprocess.run(
        [str(SCRIPT), "--print-commands"],
        env={"PATH": "/usr/bin:/bin", "GPU_SMOKE_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    return lines


def test_the_nvrx_loop_uses_the_nvrx_async_saver_and_an_inprocess_restart_on_cuda(commands: list[list[str]]) -> None:
    argv = commands[0]
    launcher = torchrun_parser().parse_args(argv[1:])
    assert (launcher.module, launcher.training_script, launcher.standalone) == (True, "training.nvrx_fsdp", True)
    job, check_only = nvrx_fsdp.parse_command(launcher.training_script_args)
    assert not check_only
    assert (job.device, job.ckpt_saver, job.ckpt_mode) == ("cuda", "nvrx", "async")
    assert job.inprocess.enabled
    assert job.fault is not None
    assert job.fault.kind.value == "exception"
    assert job.steps > job.fault.step > job.ckpt_every  # a checkpoint exists before the fault


def test_the_ray_finetune_runs_on_gpus_with_shared_storage(commands: list[list[str]]) -> None:
    argv = commands[1]
    assert argv[:3] == ["python", "-m", "training.ray_finetune"]
    args = ray_finetune.parse_args(argv[3:])
    assert args.use_gpu is True
    assert args.storage_path
    assert args.output_json


def test_the_fabric_probe_runs_on_cuda(commands: list[list[str]]) -> None:
    launcher = torchrun_parser().parse_args(commands[2][1:])
    assert launcher.training_script == "training.fabric_probe"
    args = fabric_probe.parse_args(launcher.training_script_args)
    assert (args.device, args.max_bytes) == ("cuda", 256 << 20)
    assert args.output_json is not None


def test_the_pins_it_installs_are_the_projects() -> None:
    text = SCRIPT.read_text()
    (pattern,) = re.findall(r"grep -E '([^']+)'", text)
    requirements = (ROOT / "requirements-dev.txt").read_text().splitlines()
    pins = [line for line in requirements if re.match(pattern, line)]
    assert sorted(p.split("==")[0] for p in pins) == sorted(
        ["torch", "ray[default,train]", "transformers", "tokenizers", "safetensors", "numpy", "nvidia-resiliency-ext"]
    )


def test_the_table_renders_without_results(tmp_path: Path) -> None:
    text = SCRIPT.read_text()
    table = text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", table, str(tmp_path), "1", "PASS", "10", "FAIL (exit 1)", "5", "PASS", "3", "20"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "GPU smoke on 1 GPU(s), 20 s in all"
    assert [line.split()[0] for line in lines[2:]] == ["nvrx", "ray", "fabric"]
    assert "FAIL (exit 1)" in lines[3]

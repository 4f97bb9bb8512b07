"""Real NVRx runs (ft_launcher, 2 CPU ranks over gloo, the tiny Qwen2, async checkpoints every 2 steps, 8 steps),
run once per session (tests/training/conftest.py) and read by the NVRx tests and the goodput ledger's tests."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.image_envs import tool
from tests.tiers import starts_training_processes
from tests.training.emf_schema import validate
from training.emf import parse_lines

ROOT = Path(__file__).resolve().parents[2]
# With IMAGE_ENVS=1 (make test-image) the NVRx image's environment: its Python, torch and NVRx.
FT_LAUNCHER = tool("nvrx-train", "ft_launcher", str(Path(sys.executable).with_name("ft_launcher")))
STEPS = 8
CKPT_EVERY = 2
COMMON = (
    *("--device", "cpu", "--seq-len", "32", "--batch-size", "2", "--steps", str(STEPS)),
    *("--ckpt-every", str(CKPT_EVERY), "--ckpt-keep", "2", "--lr", "3e-3", "--seed", "7"),
)


@dataclass(frozen=True)
class NvrxRun:
    metrics: dict[str, Any]
    log: str
    journal: Path
    emf: list[dict[str, Any]]


def store_addr() -> str:
    """--store-addr for an --inprocess run: two free ports (the base store's and the Wrapper's, PORT + 1) below the
    kernel's ephemeral range (32768-60999 here), where no client socket of another test can take them between this
    check and the bind. The default, ft_launcher's MASTER_PORT + 1 under --standalone, lies inside that range and
    failed once with EADDRINUSE while other tests ran."""
    for _ in range(100):
        port = random.randrange(20000, 32000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return f"127.0.0.1:{port}"
    raise RuntimeError("no two free ports between 20000 and 32000")


@starts_training_processes
def launch(out: Path, model_dir: Path, *extra: str, max_restarts: int = 2, ft: tuple[str, ...] = ()) -> NvrxRun:
    metrics = out / "metrics.json"
    argv = [
        *(FT_LAUNCHER, "--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts), *ft),
        *("-m", "training.nvrx_fsdp", *COMMON, "--model", str(model_dir)),
        *("--ckpt-dir", str(out / "ckpt"), "--metrics-file", str(metrics), *extra),
    ]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=170, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    result: dict[str, Any] = json.loads(metrics.read_text())
    lines = parse_lines(done.stdout)
    for line in lines:
        validate(line)
    return NvrxRun(metrics=result, log=log, journal=out / "ckpt" / "journal.jsonl", emf=lines)

"""`python -m training.ray_finetune` as a real process (argument parsing only: no Ray cluster is started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
@pytest.mark.training
def test_module_help_lists_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.ray_finetune", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for flag in (
        *("--model", "--num-workers", "--use-gpu", "--no-use-gpu", "--steps", "--batch-size", "--seq-len"),
        *("--lr", "--seed", "--data", "--storage-path", "--output-json"),
    ):
        assert flag in done.stdout
    assert "Qwen/Qwen2.5-1.5B" in done.stdout

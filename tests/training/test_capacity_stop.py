"""A Capacity Block ending mid-run, for real: the pod's entry (the supervisor over ft_launcher over 2 CPU ranks of
training/nvrx_fsdp.py) checkpoints the last completed step, stops and exits 78 - not ft_launcher's 1, which no FailJob
rule matches - and the next run resumes from that checkpoint and ends bit-identical to the uninterrupted run."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # pinned in requirements-dev.txt (NVRx imports it); no stubs
import pytest

from tests.tiers import starts_training_processes
from tests.training.nvrx_runs import COMMON, FT_LAUNCHER, ROOT, NvrxRun, launch
from tests.training.test_nvrx_fsdp import assert_same_result
from trainctl.goodput import ledger_for, render
from training import checkpointing as ckpt
from training import deadline
from training.journal import JOURNAL_FILE, block_stops, read_journal

STOP_AFTER = 3  # not a checkpoint step (--ckpt-every 2): the stop's own save is the one resumed


@starts_training_processes
def pod_entry(out: Path, model_dir: Path, env: dict[str, str]) -> tuple[int, str, float]:
    argv = [
        *(sys.executable, "-m", "training.fabric_gate", "supervise", "--"),
        *(FT_LAUNCHER, "--standalone", "--nproc-per-node", "2", "--max-restarts", "2"),
        *("-m", "training.nvrx_fsdp", *COMMON, "--model", str(model_dir)),
        *("--ckpt-dir", str(out / "ckpt"), "--metrics-file", str(out / "metrics.json")),
    ]
    began = time.monotonic()
    log = out / "pod-entry.log"
    with log.open("w") as sink:
        entry = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=sink, stderr=subprocess.STDOUT)
        # The pod ends when its entry does: the container's end takes every process left in it. Here the launcher's
        # helpers (its workers run in sessions of their own) may outlive the entry, so they are gathered while it runs
        # and ended with it; waiting on the output pipe instead hung until they went (seen once, 120 s).
        family: dict[int, psutil.Process] = {}
        deadline_s = began + 120
        while entry.poll() is None:
            if time.monotonic() > deadline_s:
                entry.kill()
                raise AssertionError(f"the pod entry ran past 120 s:\n{log.read_text()[-6000:]}")
            with contextlib.suppress(psutil.NoSuchProcess):
                family.update((p.pid, p) for p in psutil.Process(entry.pid).children(recursive=True))
            time.sleep(0.1)
        seconds = time.monotonic() - began
        for process in family.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    return entry.returncode, log.read_text(), seconds


@pytest.mark.timeout(300)
def test_a_block_ending_mid_run_saves_stops_and_resumes_bit_identical(
    nvrx_reference: NvrxRun, tiny_model_dir: Path, tmp_path: Path
) -> None:
    block = {
        "PLATFORM_REHEARSAL": "cpu",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
        "FABRIC_GATE_POD_DIR": str(tmp_path / "pod"),
        deadline.DEADLINE_ENV: (datetime.now(UTC) + timedelta(days=1)).isoformat(),
        deadline.MARGIN_ENV: "2400",
        deadline.STEP_SECONDS_ENV: "0.5",
        deadline.INJECT_ENV: f"step:{STOP_AFTER}",
    }
    code, log, seconds = pod_entry(tmp_path, tiny_model_dir, block)
    assert code == deadline.EXIT_STOPPED, log[-6000:]
    assert f"checkpointed step {STOP_AFTER} and stopped" in log
    assert (ckpt.step_dir(tmp_path / "ckpt", STOP_AFTER) / ckpt.MARKER).exists()
    assert not ckpt.step_dir(tmp_path / "ckpt", STOP_AFTER + 1).exists()
    (stop,) = block_stops(read_journal(tmp_path / "ckpt" / JOURNAL_FILE))
    assert (stop["outcome"], stop["step"], stop["resumes_from"], stop["unsaved_steps"]) == ("stopped", 3, 3, 0)
    assert f"stopped for a Capacity Block at step {STOP_AFTER}" in render(
        ledger_for(tmp_path / "ckpt" / JOURNAL_FILE, instance_type=None, nodes=1)
    )
    print(f"pod entry stopped at the block's stop point and exited {code} in {seconds:.1f} s")
    # The next capacity: no deadline. It resumes from the stop's checkpoint and loses no step.
    resumed = launch(tmp_path, tiny_model_dir)
    assert f"resume from step {STOP_AFTER}" in resumed.log
    reference: dict[str, Any] = nvrx_reference.metrics
    assert_same_result(resumed.metrics, reference)

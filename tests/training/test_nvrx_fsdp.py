"""training.nvrx_fsdp: its command line, and real fault-tolerant runs under ft_launcher.

The runs are real processes: ft_launcher, 2 CPU ranks over gloo, the tiny Qwen2, FSDP2, async checkpoints every
2 steps, 8 steps. Each faulty run is compared with one uninterrupted run of the same seed.

Why the final parameters are compared bit for bit (sha256), not with a tolerance: every input of every step is a
pure function of (seed, rank, step); the model and AdamW state are restored exactly (DCP stores the tensors' bytes);
ft_launcher sets OMP_NUM_THREADS=1 for each rank, so CPU kernels reduce in a fixed order; and gloo's sum over two
ranks (a + b) does not depend on arrival order. A resumed run therefore executes the same floating-point
operations in the same order as the uninterrupted one.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.nvrx_runs import STEPS, NvrxRun
from training.faults import FaultKind, FaultSpec
from training.journal import summarize
from training.nvrx_config import InprocessConfig, Job, StoreAddress, build_parser, parse_job, parse_store_addr
from training.nvrx_fsdp import batch_source, build_wrapper, main, plan_device

# --- command line ------------------------------------------------------------------------------------------------


def test_help_lists_the_chart_contract() -> None:
    text = build_parser().format_help()
    for flag in (
        *("--model", "--data", "--seq-len", "--batch-size", "--steps", "--lr", "--seed", "--device"),
        *("--ckpt-dir", "--ckpt-every", "--ckpt-mode", "--ckpt-keep", "--inprocess", "--inprocess-soft-timeout"),
        *("--inprocess-hard-timeout", "--inprocess-barrier-timeout", "--inprocess-max-iterations", "--store-addr"),
        *("--fault", "--fault-step", "--fault-rank", "--metrics-file"),
    ):
        assert flag in text, flag
    assert "Qwen/Qwen2.5-1.5B" in text


def test_flags_become_a_job(tmp_path: Path) -> None:
    job = parse_job(
        [
            *("--ckpt-dir", str(tmp_path), "--steps", "10", "--ckpt-every", "5", "--ckpt-mode", "sync"),
            *("--inprocess", "--inprocess-soft-timeout", "5", "--inprocess-hard-timeout", "10"),
            *("--inprocess-barrier-timeout", "20", "--inprocess-max-iterations", "3"),
            *("--store-addr", "trainer-0.trainer:29510", "--fault", "exception", "--fault-step", "7"),
        ]
    )
    assert job.ckpt_dir == tmp_path.resolve()
    assert (job.steps, job.ckpt_every, job.ckpt_mode) == (10, 5, "sync")
    assert job.inprocess == InprocessConfig(True, 5.0, 10.0, 20.0, 3)
    assert job.store_addr == StoreAddress("trainer-0.trainer", 29510)
    assert job.fault == FaultSpec(FaultKind.EXCEPTION, 7, 0)
    assert job.marker == tmp_path.resolve() / ".fault-exception-step7-rank0.fired"
    assert [job.is_checkpoint_step(s) for s in (4, 5, 9, 10)] == [False, True, False, True]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--inprocess-soft-timeout", "90"],
            "--inprocess-soft-timeout 90 must be less than --inprocess-hard-timeout 90",
        ),
        (["--inprocess-hard-timeout", "130"], "--inprocess-hard-timeout 130 must be less than --inprocess-barrier"),
        (["--inprocess-soft-timeout", "0.5"], "--inprocess-soft-timeout 0.5 must be longer than NVRx's 1 s"),
        (["--inprocess-soft-timeout", "nan"], "--inprocess-soft-timeout nan must be a positive number"),
        (["--inprocess-max-iterations", "0"], "--inprocess-max-iterations 0 must be at least 1"),
        (["--store-addr", "trainer-0"], "--store-addr 'trainer-0' is not HOST:PORT"),
        (["--store-addr", "h:70000"], "port 70000 is out of range"),
        (["--fault", "kill", "--fault-step", "12", "--steps", "10"], "--fault-step 12 is past --steps 10"),
        (["--fault", "boom", "--fault-step", "2"], "--fault 'boom' is not a fault kind"),
        (["--fault-rank", "1"], "--fault-rank was given without --fault"),
        (["--steps", "0"], "--steps 0 must be at least 1"),
        (["--ckpt-saver", "nvrx", "--ckpt-slow-write-s", "1"], "--ckpt-slow-write-s works with the torch savers"),
        (["--min-step-s", "-1"], "--min-step-s -1 must be 0 or more seconds"),
        (["--ckpt-saver", "nvrx", "--device", "cpu"], "--ckpt-saver nvrx needs --device cuda"),
    ],
)
def test_bad_flags_exit_with_a_message_naming_them(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_job(["--ckpt-dir", str(tmp_path), *argv])
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


def test_store_addr_forms() -> None:
    assert parse_store_addr("10.0.0.5:29501") == StoreAddress("10.0.0.5", 29501)
    assert parse_store_addr("[fd00::5]:29501") == StoreAddress("fd00::5", 29501)
    for bad in ("", ":29501", "host:", "host:port", "host:0"):
        with pytest.raises(ValueError, match="--store-addr"):
            parse_store_addr(bad)


def test_timeouts_are_checked_like_nvrx_does() -> None:
    # Ours refuses what NVRx 0.7.0 refuses (soft < hard < barrier), with a message naming the flags...
    with pytest.raises(ValueError, match="--inprocess-hard-timeout 30 must be less than --inprocess-barrier-timeout"):
        InprocessConfig(enabled=True, soft_timeout_s=10, hard_timeout_s=30, barrier_timeout_s=30)
    from nvidia_resiliency_ext import inprocess

    seconds = datetime.timedelta
    with pytest.raises(ValueError, match="soft_timeout < hard_timeout < barrier_timeout"):
        inprocess.Wrapper(
            soft_timeout=seconds(seconds=10), hard_timeout=seconds(seconds=30), barrier_timeout=seconds(seconds=30)
        )
    # ...and what it accepts builds a Wrapper with our store, retry and timeout settings.
    cfg = InprocessConfig(enabled=True, soft_timeout_s=2, hard_timeout_s=3, barrier_timeout_s=4, max_iterations=2)
    wrapper = build_wrapper(cfg, StoreAddress("localhost", 29501), plan_device("cpu"))
    assert wrapper.store_kwargs["port"] == 29502
    assert wrapper.heartbeat_timeout < wrapper.barrier_timeout
    assert wrapper.initialize.max_iterations == 2
    assert (wrapper.soft_timeout, wrapper.hard_timeout) == (seconds(seconds=2), seconds(seconds=3))


def test_summarize_measures_recovery_from_the_journal() -> None:
    ctx = {"run_id": "r", "restart": 0, "iteration": 0}
    later = {"run_id": "r", "restart": 1, "iteration": 0}
    events: list[dict[str, Any]] = [
        {"event": "start", "time": 0.0, "rank": 0, "pid": 10, **ctx},
        {"event": "save", "time": 1.0, "step": 2, "saver": "sync", "stall_s": 0.5, **ctx},
        {"event": "commit", "time": 1.1, "step": 2, "stall_s": 0.5, "commit_wait_s": 0.0, **ctx},
        {"event": "save", "time": 2.0, "step": 4, "saver": "sync", "stall_s": 0.25, **ctx},
        {
            **{"event": "fault", "time": 3.0, "fault": "kill", "step": 6, "rank": 1, "completed_steps": 5},
            **{"last_committed": 2, **ctx},
        },
        {"event": "start", "time": 9.0, "rank": 0, "pid": 11, **later},
        {"event": "resumed", "time": 10.5, "step": 2, "ignored_incomplete": [4], **later},
    ]
    summary = summarize(events)
    unchecked = {"verified": False, "verify_failed": None}  # a journal without read-back events
    assert summary["saves"] == [
        {"step": 2, "saver": "sync", "stall_s": 0.5, "committed": True, **unchecked, **ctx},
        {"step": 4, "saver": "sync", "stall_s": 0.25, "committed": False, **unchecked, **ctx},
    ]
    assert summary["save_stall_s"] == {"count": 2, "median": 0.375, "max": 0.5}
    (recovery,) = summary["recoveries"]
    assert recovery["recovery_s"] == 7.5
    assert recovery["recovered_by"] == "ft_launcher"
    assert (recovery["resumed_step"], recovery["steps_lost"], recovery["steps_since_checkpoint"]) == (2, 3, 3)
    assert summary["restarts"] == {"torchelastic": 1, "inprocess_iterations": 0, "launches": 1}


# --- real runs ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(nvrx_reference: NvrxRun) -> dict[str, Any]:
    metrics = nvrx_reference.metrics
    # Rank 0 published one EMF throughput line per step (--log-every 1), each valid per the EMF spec
    # (validated in launch), and no restart line.
    throughput = [line for line in nvrx_reference.emf if "TokensPerSecond" in line]
    assert [line["Step"] for line in throughput] == list(range(1, STEPS + 1))
    assert all(line["TokensPerSecond"] == pytest.approx(2 * 32 * 2 / line["StepTime"]) for line in throughput)
    assert not [line for line in nvrx_reference.emf if "Restarts" in line]
    assert [s["step"] for s in metrics["step_times"]] == list(range(1, STEPS + 1))
    assert metrics["recoveries"] == []
    assert metrics["restarts"] == {"torchelastic": 0, "inprocess_iterations": 0, "launches": 1}
    assert [s["step"] for s in metrics["saves"]] == [2, 4, 6, 8]
    assert all(s["committed"] for s in metrics["saves"])
    # Every save was read back on both ranks before it was published (training/ckpt_verify.py).
    assert all(s["verified"] for s in metrics["saves"])
    assert metrics["verify_failures"] == []
    assert len(metrics["param_sha256"]) == 64
    return metrics


def assert_same_result(run: dict[str, Any], reference: dict[str, Any]) -> None:
    assert run["param_sha256"] == reference["param_sha256"]
    assert run["final_loss"] == reference["final_loss"]
    last_loss = {s["step"]: s["loss"] for s in run["step_times"]}  # the re-run steps overwrite the lost ones
    assert last_loss == {s["step"]: s["loss"] for s in reference["step_times"]}


def only_recovery(run: dict[str, Any], kind: str, by: str) -> dict[str, Any]:
    (recovery,) = run["recoveries"]
    assert recovery["fault"] == kind
    assert recovery["recovered_by"] == by
    # Resumed from the checkpoint that was committed when the fault hit: no more steps lost than since then.
    assert recovery["resumed_step"] == recovery["last_committed"]
    assert 0 <= recovery["steps_lost"] == recovery["steps_since_checkpoint"]
    assert recovery["recovery_s"] > 0
    return recovery


@pytest.mark.timeout(180)
def test_sigkill_restarts_the_workers_and_reproduces_the_uninterrupted_run(
    reference: dict[str, Any], nvrx_sigkill: NvrxRun
) -> None:
    run, log = nvrx_sigkill.metrics, nvrx_sigkill.log
    (restart_line,) = [line for line in nvrx_sigkill.emf if "Restarts" in line]
    assert (restart_line["Restarts"], restart_line["TorchelasticRestart"]) == (1, 1)
    recovery = only_recovery(run, "kill", "ft_launcher")
    assert recovery["completed_steps"] == 5
    assert run["restarts"]["torchelastic"] == 1
    assert {s["restart"] for s in run["starts"]} == {0, 1}
    assert "fault injected: kill at step 6 on rank 1" in log
    assert f"resume from step {recovery['resumed_step']}" in log
    assert_same_result(run, reference)


@pytest.mark.timeout(180)
def test_exception_is_recovered_in_process(reference: dict[str, Any], nvrx_exception: NvrxRun) -> None:
    run, log = nvrx_exception.metrics, nvrx_exception.log
    only_recovery(run, "exception", "inprocess")
    assert run["restarts"]["torchelastic"] == 0
    assert run["restarts"]["inprocess_iterations"] == 1
    pids = {(s["rank"], s["iteration"]): s["pid"] for s in run["starts"]}
    assert sorted(pids) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert pids[(0, 0)] == pids[(0, 1)], "rank 0 ran both iterations in the same process"
    assert pids[(1, 0)] == pids[(1, 1)], "rank 1 ran both iterations in the same process"
    assert "restart detected: torchelastic restart 0, in-process iteration 1" in log
    assert_same_result(run, reference)


@pytest.mark.timeout(180)
def test_hang_is_caught_by_the_heartbeat_timeout(reference: dict[str, Any], nvrx_hang: NvrxRun) -> None:
    run, log = nvrx_hang.metrics, nvrx_hang.log
    recovery = only_recovery(run, "hang", "ft_launcher")
    assert recovery["recovery_s"] > 5, "detection alone takes the 5 s heartbeat timeout"
    assert "Did not get subsequent heartbeat" in log
    assert run["restarts"]["torchelastic"] == 1
    assert_same_result(run, reference)


@pytest.mark.timeout(180)
def test_kill_during_async_save_never_loads_the_partial_checkpoint(
    reference: dict[str, Any], nvrx_kill_during_save: NvrxRun
) -> None:
    run, log = nvrx_kill_during_save.metrics, nvrx_kill_during_save.log
    recovery = only_recovery(run, "kill-during-save", "ft_launcher")
    # Saving step 6 first committed step 4; rank 1 died with its step-6 shard on disk, uncommitted.
    assert recovery["last_committed"] == 4
    assert "__1_0.distcp" in recovery["files_at_fault"]
    assert "COMMITTED" not in recovery["files_at_fault"]
    assert ".metadata" not in recovery["files_at_fault"]
    resumes = [(r["step"], r["ignored_incomplete"]) for r in run["resumes"]]
    assert resumes == [(0, []), (4, [6])]
    assert "ignoring incomplete checkpoint(s) at step 6 (no COMMITTED marker)" in log
    assert "resume from step 4" in log
    resumed = run["resumes"][1]
    assert resumed["chosen_because"] == "step 4 is the newest checkpoint whose read-back verified"
    assert resumed["skipped"] == ["step 6: no COMMITTED marker (a save cut short)"]
    # The step-6 checkpoint that exists now is the one saved again after the restart.
    saves6 = [s for s in run["saves"] if s["step"] == 6]
    assert [(s["restart"], s["committed"]) for s in saves6] == [(0, False), (1, True)]
    assert_same_result(run, reference)


def test_without_a_launcher_main_says_how_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set: start this under"):
        main(["--ckpt-dir", str(tmp_path)])


def test_data_file_batches_are_packed_text(tiny_model_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    job = Job(model=str(tiny_model_dir), ckpt_dir=tmp_path, data=corpus_file, seq_len=16, batch_size=3)
    first = batch_source(job, vocab_size=512, rank=0, world_size=2).batch(0)
    other = batch_source(job, vocab_size=512, rank=1, world_size=2).batch(0)
    assert tuple(first.input_ids.shape) == (3, 16)
    assert not torch.equal(first.input_ids, other.input_ids), "ranks read different rows"
    assert torch.equal(first.input_ids, batch_source(job, 512, 0, 2).batch(0).input_ids), "same (seed, rank, step)"
    synthetic = batch_source(Job(model="m", ckpt_dir=tmp_path, seq_len=8, batch_size=2), 512, 0, 2).batch(5)
    assert tuple(synthetic.input_ids.shape) == (2, 8)


def test_job_defaults_match_the_documented_contract(tmp_path: Path) -> None:
    job = Job(model="m", ckpt_dir=tmp_path)
    assert (job.ckpt_mode, job.ckpt_keep, job.inprocess.enabled) == ("async", 2, False)
    assert (job.inprocess.soft_timeout_s, job.inprocess.hard_timeout_s, job.inprocess.barrier_timeout_s) == (
        60,
        90,
        120,
    )
    assert parse_job(["--ckpt-dir", str(tmp_path)]).model == "Qwen/Qwen2.5-1.5B"


def test_rank_0_leaves_last_so_its_stores_outlive_every_ranks_wrapper_shutdown() -> None:
    """Rank 0 hosts the NVRx Wrapper's TCPStore; when it exited first, ranks still in the Wrapper's termination
    barrier failed with 'Connection was likely closed' (seen in the NVRx rehearsals with min-healthy)."""
    import datetime
    import threading
    import time

    from torch._C._distributed_c10d import TCPStore

    from training.nvrx_fsdp import leave_together

    timeout = datetime.timedelta(seconds=10)
    host = TCPStore("127.0.0.1", 0, 3, is_master=True, timeout=timeout, wait_for_workers=False, multi_tenant=True)
    peers = [TCPStore("127.0.0.1", host.port, 3, is_master=False, timeout=timeout) for _ in range(2)]
    started = time.monotonic()

    def late_rank() -> None:
        time.sleep(0.5)
        leave_together(peers[0], rank=1, world_size=3, timeout_s=10)

    late = threading.Thread(target=late_rank)
    late.start()
    leave_together(peers[1], rank=2, world_size=3, timeout_s=10)
    assert time.monotonic() - started < 0.4  # a rank other than 0 never waits
    leave_together(host, rank=0, world_size=3, timeout_s=10)
    assert time.monotonic() - started >= 0.5  # rank 0 left only after the late rank
    late.join()
    # A rank that never leaves (it died) holds rank 0 only until the timeout.
    started = time.monotonic()
    leave_together(host, rank=0, world_size=10, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5

"""Fault specs from the command line, and faults that fire once per job (in this process and in real children)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training import faults
from training.faults import (
    FaultInjector,
    FaultKind,
    FaultSpec,
    FaultSpecError,
    InjectedFaultError,
    check_fault,
    check_rank,
    parse_fault,
)

ROOT = Path(__file__).resolve().parents[2]


def test_parse_fault_reads_the_three_flags() -> None:
    assert parse_fault("kill", 6, 1) == FaultSpec(kind=FaultKind.KILL, step=6, rank=1)
    assert parse_fault("kill-during-save", 4, None) == FaultSpec(kind=FaultKind.KILL_DURING_SAVE, step=4, rank=0)
    assert parse_fault(None, None, None) is None
    assert str(parse_fault("hang", 3, 0)) == "hang at step 3 on rank 0"


@pytest.mark.parametrize(
    ("kind", "step", "rank", "expected"),
    [
        ("explode", 3, 0, ["--fault 'explode'", "kill, exception, hang, kill-during-save, corrupt-shard, torn-save"]),
        ("kill", None, 0, ["--fault kill needs --fault-step N"]),
        ("kill", 0, 0, ["--fault-step 0", "count from 1", "--fault-step 3"]),
        ("exception", -2, 0, ["--fault-step -2"]),
        ("hang", 3, -1, ["--fault-rank -1", "count from 0"]),
        (None, 3, None, ["--fault-step was given without --fault", "add --fault KIND"]),
        (None, None, 1, ["--fault-rank was given without --fault"]),
    ],
)
def test_bad_fault_flags_say_which_flag_and_how_to_fix(
    kind: str | None, step: int | None, rank: int | None, expected: list[str]
) -> None:
    with pytest.raises(FaultSpecError) as caught:
        parse_fault(kind, step, rank)
    for text in expected:
        assert text in str(caught.value)


def test_faults_that_could_never_fire_are_refused() -> None:
    with pytest.raises(FaultSpecError, match=r"--fault-step 12 is past --steps 10.*1\.\.10"):
        check_fault(FaultSpec(FaultKind.KILL, 12, 0), steps=10, ckpt_every=2, ckpt_mode="async")
    with pytest.raises(FaultSpecError, match=r"--fault-step 5 is not a checkpoint step.*--ckpt-every 2"):
        check_fault(FaultSpec(FaultKind.KILL_DURING_SAVE, 5, 0), steps=10, ckpt_every=2, ckpt_mode="async")
    with pytest.raises(FaultSpecError, match=r"needs --ckpt-mode async \(got sync\)"):
        check_fault(FaultSpec(FaultKind.KILL_DURING_SAVE, 4, 0), steps=10, ckpt_every=2, ckpt_mode="sync")
    with pytest.raises(FaultSpecError, match=r"--fault-rank 2 does not exist: the job has 2 ranks \(0\.\.1\)"):
        check_rank(FaultSpec(FaultKind.HANG, 3, 2), world_size=2)
    # The last step is always a checkpoint step, and a valid fault passes silently.
    check_fault(FaultSpec(FaultKind.KILL_DURING_SAVE, 9, 0), steps=9, ckpt_every=2, ckpt_mode="async")
    check_rank(FaultSpec(FaultKind.HANG, 3, 1), world_size=2)


def test_exception_fires_once_per_job_even_across_restarts(tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    spec = FaultSpec(FaultKind.EXCEPTION, step=3, rank=1)
    fired: list[FaultSpec] = []
    injector = FaultInjector(spec, marker=marker, rank=1, on_fire=fired.append)
    for step in (1, 2):
        injector.before_step(step)
    FaultInjector(spec, marker=marker, rank=0).before_step(3)  # other rank: nothing
    injector.after_save_started(3, written=lambda: True)  # not a kill-during-save fault
    assert not marker.exists()
    with pytest.raises(InjectedFaultError, match="exception at step 3 on rank 1"):
        injector.before_step(3)
    assert marker.exists(), "the marker must exist before the fault fires"
    assert fired == [spec]
    # A restarted process (new injector, same marker) goes past the step.
    FaultInjector(spec, marker=marker, rank=1, on_fire=fired.append).before_step(3)
    assert fired == [spec]


def test_kill_during_save_waits_until_the_shards_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[float] = []
    monkeypatch.setattr(faults, "kill_self", lambda: kills.append(time.monotonic()))
    polls = {"count": 0}

    def written() -> bool:
        polls["count"] += 1
        return polls["count"] >= 5

    injector = FaultInjector(FaultSpec(FaultKind.KILL_DURING_SAVE, 4, 0), marker=tmp_path / "m", rank=0)
    injector.before_step(4)  # fires after the save, not before the step
    assert kills == []
    injector.after_save_started(4, written=written)
    assert polls["count"] == 5
    assert len(kills) == 1
    injector.after_save_started(4, written=written)
    assert len(kills) == 1


@pytest.mark.parametrize("kind", [FaultKind.CORRUPT_SHARD, FaultKind.TORN_SAVE])
def test_damage_faults_hit_a_written_checkpoint_once_before_its_read_back(tmp_path: Path, kind: FaultKind) -> None:
    spec = parse_fault(kind.value, 4, 1)
    assert spec == FaultSpec(kind, 4, 1)
    with pytest.raises(FaultSpecError, match=rf"--fault-step 3 is not a checkpoint step, so --fault {kind.value}"):
        check_fault(FaultSpec(kind, 3, 1), steps=10, ckpt_every=2, ckpt_mode="sync")
    check_fault(spec, steps=10, ckpt_every=2, ckpt_mode="sync")  # any save mode: both are verified
    fired: list[FaultSpec] = []
    damaged: list[FaultKind] = []
    injector = FaultInjector(spec, marker=tmp_path / "m", rank=1, on_fire=fired.append)
    injector.before_step(4)
    injector.after_save_started(4, written=lambda: True)
    injector.before_verify(2, damaged.append)
    FaultInjector(spec, marker=tmp_path / "m", rank=0).before_verify(4, damaged.append)
    assert (fired, damaged) == ([], [])
    injector.before_verify(4, damaged.append)
    assert (fired, damaged) == ([spec], [kind])
    injector.before_verify(4, damaged.append)
    assert damaged == [kind], "once per job"


CHILD = """
import sys
from pathlib import Path
from training.faults import FaultInjector, FaultSpec, FaultKind
marker = Path(sys.argv[2])
def on_fire(spec):
    print("firing", spec, flush=True)
FaultInjector(FaultSpec(FaultKind(sys.argv[1]), 2, 0), marker=marker, rank=0, on_fire=on_fire).before_step(2)
print("survived", flush=True)
"""


def child(kind: str, marker: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, str(marker)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.timeout(60)
def test_kill_is_a_sigkill_that_fires_once(tmp_path: Path) -> None:
    marker = tmp_path / "kill.fired"
    first = child("kill", marker)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert "firing kill at step 2 on rank 0" in out
    assert "survived" not in out
    assert marker.exists()
    second = child("kill", marker)
    out, _ = second.communicate(timeout=30)
    assert second.returncode == 0
    assert out.strip() == "survived"


@pytest.mark.timeout(60)
def test_hang_blocks_the_process(tmp_path: Path) -> None:
    marker = tmp_path / "hang.fired"
    hung = child("hang", marker)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists()
        time.sleep(1.0)
        assert hung.poll() is None, "a hang fault must keep the process blocked"
    finally:
        hung.kill()
        out, _ = hung.communicate(timeout=30)
    assert "firing hang" in out
    assert "survived" not in out

"""Fault injection for fault-tolerance tests and benchmarks: one fault, at one step, on one rank.

    --fault kill --fault-step 6 --fault-rank 1

Kinds (all fire at the start of step N, before its forward pass, except kill-during-save):
  kill               SIGKILL to this process (no Python cleanup, like an OOM kill or a lost node)
  exception          raises InjectedFaultError (a Python error the in-process restart can recover from)
  hang               blocks forever without heartbeats (a stuck collective or kernel)
  kill-during-save   SIGKILL right after the checkpoint of step N started, once this rank's shard files are on
                     disk but before the save is committed (training.nvrx_fsdp's test-only --ckpt-slow-write-s
                     keeps the save uncommitted for that long after the shards are written)
  corrupt-shard      flips a byte of this rank's shard of the checkpoint of step N after it is written, before
                     it is read back (training/ckpt_verify.py): the save must be quarantined, never published
  torn-save          truncates that shard to half its length at the same moment, as a save torn by a failing
                     file system leaves it

A fault fires at most once per job, even across restarts: a marker file is created (O_EXCL) just before it fires,
and an existing marker disarms it. This module imports nothing heavy, so tests can use it without torch.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class FaultKind(enum.StrEnum):
    KILL = "kill"
    EXCEPTION = "exception"
    HANG = "hang"
    KILL_DURING_SAVE = "kill-during-save"
    CORRUPT_SHARD = "corrupt-shard"
    TORN_SAVE = "torn-save"


# Where a fault fires: before a step's forward pass, once the step's save has started, or between the save's
# write and its read-back.
PHASE = {FaultKind.KILL_DURING_SAVE: "save", FaultKind.CORRUPT_SHARD: "verify", FaultKind.TORN_SAVE: "verify"}


KINDS = ", ".join(kind.value for kind in FaultKind)


class InjectedFaultError(RuntimeError):
    """The error an `exception` fault raises."""


class FaultSpecError(ValueError):
    """A fault flag that cannot work; the message names the flag, the value and the fix."""


@dataclass(frozen=True)
class FaultSpec:
    kind: FaultKind
    step: int
    rank: int

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FaultKind):
            raise FaultSpecError(f"--fault {self.kind!r} is not a fault kind; use one of: {KINDS}")
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise FaultSpecError(
                f"--fault-step {self.step!r} is not a step: steps count from 1 (the fault fires at the start of "
                "that step); use e.g. --fault-step 3"
            )
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise FaultSpecError(
                f"--fault-rank {self.rank!r} is not a rank: ranks count from 0; use e.g. --fault-rank 0"
            )

    def __str__(self) -> str:
        return f"{self.kind.value} at step {self.step} on rank {self.rank}"


def parse_fault(kind: str | None, step: int | None, rank: int | None) -> FaultSpec | None:
    """The fault described by --fault/--fault-step/--fault-rank, None when --fault is absent."""
    if kind is None:
        if step is not None or rank is not None:
            given = "--fault-step" if step is not None else "--fault-rank"
            raise FaultSpecError(f"{given} was given without --fault: add --fault KIND ({KINDS}) or drop {given}")
        return None
    try:
        fault_kind = FaultKind(kind)
    except ValueError:
        raise FaultSpecError(f"--fault {kind!r} is not a fault kind; use one of: {KINDS}") from None
    if step is None:
        raise FaultSpecError(f"--fault {kind} needs --fault-step N, the step (from 1) at whose start it fires")
    return FaultSpec(kind=fault_kind, step=step, rank=0 if rank is None else rank)


def check_fault(spec: FaultSpec, *, steps: int, ckpt_every: int, ckpt_mode: str) -> None:
    """Refuses faults that could never fire in this job."""
    if spec.step > steps:
        raise FaultSpecError(
            f"--fault-step {spec.step} is past --steps {steps}, so the fault would never fire; pick 1..{steps}"
        )
    if spec.kind in PHASE and spec.step % ckpt_every != 0 and spec.step != steps:
        raise FaultSpecError(
            f"--fault-step {spec.step} is not a checkpoint step, so --fault {spec.kind.value} would never fire; "
            f"use a multiple of --ckpt-every {ckpt_every} (or the last step, {steps})"
        )
    if spec.kind is FaultKind.KILL_DURING_SAVE and ckpt_mode != "async":
        raise FaultSpecError(
            f"--fault kill-during-save needs --ckpt-mode async (got {ckpt_mode}): a sync save is committed "
            "before the step loop goes on"
        )


def check_rank(spec: FaultSpec, world_size: int) -> None:
    if spec.rank >= world_size:
        raise FaultSpecError(
            f"--fault-rank {spec.rank} does not exist: the job has {world_size} ranks (0..{world_size - 1})"
        )


def default_marker(ckpt_dir: Path, spec: FaultSpec) -> Path:
    return ckpt_dir / f".fault-{spec.kind.value}-step{spec.step}-rank{spec.rank}.fired"


def claim(marker: Path) -> bool:
    """Creates the marker; False if it already exists (the fault fired earlier in this job)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"{os.getpid()} {time.time()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def hang_forever() -> None:
    # One long C-level sleep: no Python bytecode runs, so neither heartbeats nor NVRx's automatic progress
    # timestamps advance, as in a stuck collective.
    while True:
        time.sleep(3600)


class FaultInjector:
    """Fires `spec` once on its rank. on_fire runs just before the fault (after the marker is created), e.g. to
    log the moment recovery time is measured from."""

    def __init__(
        self,
        spec: FaultSpec | None,
        *,
        marker: Path | None,
        rank: int,
        on_fire: Callable[[FaultSpec], None] | None = None,
    ) -> None:
        if spec is not None and marker is None:
            raise ValueError("a fault needs a marker path")
        self.spec = spec
        self.marker = marker
        self.rank = rank
        self.on_fire = on_fire

    def armed(self, step: int, *, phase: str) -> bool:
        spec = self.spec
        if spec is None or spec.rank != self.rank or spec.step != step:
            return False
        if PHASE.get(spec.kind, "step") != phase:
            return False
        assert self.marker is not None
        return not self.marker.exists()

    def before_step(self, step: int) -> None:
        if self.armed(step, phase="step"):
            self._fire()

    def before_verify(self, step: int, damage: Callable[[FaultKind], None]) -> None:
        """corrupt-shard, torn-save: `damage` damages this rank's written shard, before it is read back."""
        if self.armed(step, phase="verify"):
            self._fire(damage)

    def after_save_started(self, step: int, written: Callable[[], bool], wait_s: float = 60.0) -> None:
        """kill-during-save: waits (bounded) until this rank's part of the save is on disk, then kills."""
        if not self.armed(step, phase="save"):
            return
        deadline = time.monotonic() + wait_s
        while not written() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._fire()

    def _fire(self, damage: Callable[[FaultKind], None] | None = None) -> None:
        spec, marker = self.spec, self.marker
        assert spec is not None
        assert marker is not None
        if not claim(marker):
            return
        if self.on_fire is not None:
            self.on_fire(spec)
        if spec.kind in (FaultKind.KILL, FaultKind.KILL_DURING_SAVE):
            kill_self()
        elif spec.kind is FaultKind.EXCEPTION:
            raise InjectedFaultError(f"injected fault: {spec}")
        elif damage is not None:
            damage(spec.kind)
        else:
            hang_forever()

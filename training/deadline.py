"""A Capacity Block's deadline inside the training: stop cleanly before the block ends, or do not start.

A GPU group on an EC2 Capacity Block loses its instances when the block ends, and Kueue admits a job onto the block
however little of it is left (kubernetes-sigs/kueue issues 10741 and 6587, open). The NVRx job's pods on such a group
carry the block's end, the stop margin and the measured step time (k8s/capacity_deadline.py); with them every rank:

- before its first step, refuses to start (EXIT_REFUSED) when the next checkpoint step cannot be reached before the
  stop point (the block's end less CAPACITY_BLOCK_STOP_MARGIN, infra/spec/environments.py);
- before each step, stops when that step would end past the stop point: it saves a checkpoint of the last completed
  step, waits until it is committed, and exits EXIT_STOPPED.

Every rank decides on rank 0's clock (broadcast), so all ranks stop at the same step. The exit code is also written
to the pod's verdict file (training/fabric_gate.py write_stop_verdict): ft_launcher turns any worker's exit into a
restart and then its own exit 1 (NVRx 0.7.0 fault_tolerance/launcher.py main: ChildFailedError -> 1; its
--ft-no-restart-exit-code, cli_args.py add_no_restart_args, covers only NVRx's own attribution and no-progress
decisions, not a worker's code), so the pod's supervisor (training/fabric_gate.py supervise) stops the launcher and
exits the pod with this code, which the Job's podFailurePolicy fails the Job on instead of burning its retries.

CPU rehearsal only (PLATFORM_REHEARSAL=cpu): CAPACITY_DEADLINE_INJECT=step:N makes the clock read the stop point once
step N is done, so a block ending mid-run is rehearsed at a known step.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from training.rehearsal import cpu_rehearsal

DEADLINE_ENV = "CAPACITY_DEADLINE"
MARGIN_ENV = "CAPACITY_STOP_MARGIN_SECONDS"
STEP_SECONDS_ENV = "CAPACITY_STEP_SECONDS"
INJECT_ENV = "CAPACITY_DEADLINE_INJECT"

EXIT_STOPPED = 78
"""Checkpointed and stopped before the Capacity Block's end: resume on the next capacity (FailJob, not retried)."""
EXIT_REFUSED = 79
"""Not started: the next checkpoint cannot be reached before the block's stop point (FailJob, not retried)."""
EXIT_CODES = (EXIT_STOPPED, EXIT_REFUSED)


@dataclass(frozen=True)
class Deadline:
    """`stop_at`: the block's end less the margin, seconds since the epoch; `step_s`: one step's measured time."""

    stop_at: float
    step_s: float
    inject_after_step: int | None = None

    def steps_left(self, now: float) -> int:
        """Whole steps that end before the stop point, from `now`."""
        return max(0, math.floor((self.stop_at - now) / self.step_s))

    def refusal(self, now: float, *, start: int, every: int, last: int) -> str | None:
        """Why a run resuming after step `start` must not start: its next checkpoint step (a multiple of `every`, or
        the last step `last`) ends after the stop point. None when it can start."""
        first = min(last, (start // every + 1) * every)
        needed = first - start
        if needed <= self.steps_left(now):
            return None
        return (
            f"capacity block: the first checkpoint (step {first}) needs {needed} step(s) x {self.step_s:g} s, but "
            f"only {self.steps_left(now)} fit before the stop point {iso(self.stop_at)}: not starting (exit "
            f"{EXIT_REFUSED}); submit it to capacity that lasts"
        )

    def must_stop(self, now: float) -> bool:
        """Whether one more step would end past the stop point."""
        return now + self.step_s > self.stop_at

    def clock(self, step: int, now: Callable[[], float] = time.time) -> float:
        """The time before step `step + 1`: the wall clock, or the stop point once the injected step is done."""
        if self.inject_after_step is not None and step >= self.inject_after_step:
            return self.stop_at
        return now()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def from_env(environ: Mapping[str, str] | None = None) -> Deadline | None:
    """The pod's deadline, None when the job is not on a Capacity Block. ValueError names a bad variable."""
    env = os.environ if environ is None else environ
    if DEADLINE_ENV not in env:
        return None
    end = datetime.fromisoformat(env[DEADLINE_ENV])
    if end.utcoffset() is None:
        raise ValueError(f"{DEADLINE_ENV}={env[DEADLINE_ENV]!r} needs its UTC offset")
    margin = float(env.get(MARGIN_ENV, "nan"))
    step_s = float(env.get(STEP_SECONDS_ENV, "nan"))
    if not (margin >= 0 and step_s > 0):
        raise ValueError(f"{MARGIN_ENV} must be >= 0 and {STEP_SECONDS_ENV} > 0 beside {DEADLINE_ENV}")
    inject = env.get(INJECT_ENV)
    after = None
    if inject and cpu_rehearsal():
        kind, _, value = inject.partition(":")
        if kind != "step" or not value.isdigit():
            raise ValueError(f"{INJECT_ENV}={inject!r}: use step:N")
        after = int(value)
    return Deadline(end.timestamp() - margin, step_s, after)

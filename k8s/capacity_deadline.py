"""A Capacity Block's deadline on the NVRx job's pods: the block's end, the stop margin and the job's measured step
time as the trainer reads them (training/deadline.py), and the podFailurePolicy rule that fails the Job on the
trainer's deadline codes instead of retrying it on a block that has ended; and the lead from which the hold
controller (capacity_hold/) stops Kueue admitting onto the block. Nothing for a group not on a block."""

from __future__ import annotations

from typing import Any

from infra.spec import GpuNodeGroupConfig
from infra.spec.environments import CAPACITY_BLOCK_STOP_MARGIN, CapacityKind
from infra.spec.kueue import PODS_READY_TIMEOUT_MINUTES
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.ray_spec import WorkloadError
from training.deadline import DEADLINE_ENV, EXIT_CODES, MARGIN_ENV, STEP_SECONDS_ENV


def on_block(group: GpuNodeGroupConfig) -> bool:
    return group.capacity.kind is CapacityKind.CAPACITY_BLOCK


def deadline_env(group: GpuNodeGroupConfig, *, job_name: str, step_seconds: float | None) -> list[dict[str, Any]]:
    """The trainer's deadline variables; refuses a job on a block whose end or step time is unknown: it could not stop
    before the block's instances are terminated, and Kueue admits it however little of the block is left."""
    if not on_block(group):
        return []
    if group.capacity.end is None:
        raise WorkloadError(
            f"nvrx job {job_name!r} runs on Capacity Block group {group.name!r}, whose capacity.end is not set; set it "
            "to the block's EndDate (aws ec2 describe-capacity-reservations) in infra/spec/environments.py"
        )
    if step_seconds is None:
        raise _no_step_time(group, job_name)
    return [
        {"name": DEADLINE_ENV, "value": group.capacity.end},
        {"name": MARGIN_ENV, "value": str(int(CAPACITY_BLOCK_STOP_MARGIN.total_seconds()))},
        {"name": STEP_SECONDS_ENV, "value": f"{step_seconds:g}"},
    ]


def _no_step_time(group: GpuNodeGroupConfig, job_name: str) -> WorkloadError:
    return WorkloadError(
        f"nvrx.step_seconds is not set for job {job_name!r} on Capacity Block group {group.name!r}: the job "
        "stops one step before the block's stop point and needs the measured step time (trainctl goodput "
        "prints it); set NvrxFsdpJob(step_seconds=...)"
    )


def deadline_rules(group: GpuNodeGroupConfig, container: str) -> list[dict[str, Any]]:
    """FailJob on the trainer's deadline codes: stopped before the block's end (a checkpoint saved) or refused to
    start; a retry would land on the same ending block."""
    if not on_block(group):
        return []
    values = list(EXIT_CODES)
    return [{"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In", "values": values}}]


# With no measured startup: the longest Kueue lets an admitted workload's pods take to become ready before it evicts
# and requeues it (waitForPodsReady, infra/spec/kueue.py). Model load and the fabric gate come on top; a job that
# still misses its first checkpoint refuses to start (training/deadline.py EXIT_REFUSED) instead of losing work.
DEFAULT_STARTUP_S = PODS_READY_TIMEOUT_MINUTES * 60.0


def first_checkpoint_lead(group: GpuNodeGroupConfig, job: NvrxFsdpJob | None) -> tuple[float, str]:
    """How long before the block's stop point Kueue must stop admitting onto `group`, and what it is made of: the NVRx
    job that runs there, its startup plus its steps to the first checkpoint (`every_steps`, or all its steps if fewer);
    with none (None), the default startup alone."""
    measured = None if job is None else job.startup_seconds
    startup = DEFAULT_STARTUP_S if measured is None else measured
    source = "measured" if measured is not None else "Kueue's waitForPodsReady timeout, no measured startup_seconds"
    if job is None:
        return startup, f"startup {startup:g} s ({source}); no checkpointing job runs on group {group.name}"
    if job.step_seconds is None:
        raise _no_step_time(group, job.name)
    first = min(job.checkpoint.every_steps, job.steps)
    lead = startup + first * job.step_seconds
    return lead, (
        f"startup {startup:g} s ({source}) + {first} steps x {job.step_seconds:g} s to job {job.name}'s first "
        "checkpoint"
    )

"""Synth refuses an NVRx job whose full state its environment's checkpoint file system cannot write within
WRITE_FRACTION of the job's checkpoint interval (infra/spec/checkpoint_throughput.py has the facts and the rule),
naming the three fixes with numbers: more capacity, a higher throughput tier, a longer interval.

The interval in seconds is every_steps x the step time, taken from the first of: the measured
NvrxFsdpJob.step_seconds; the job's measured throughput baseline on its group (infra/spec/throughput_baselines.json,
`trainctl baseline record`) at the job's node count; the fastest step the job's GPUs could run (step_floor_s), so
that a job is never let through on a guess.

On a Capacity Block group the stop's save (training/deadline.py) must also be written within WRITE_FRACTION of the
time between the stop point and the block's first terminations (CAPACITY_BLOCK_STOP_MARGIN less
CAPACITY_BLOCK_TERMINATION_LEAD: 10 minutes), or the job loses everything since its previous save.

The Ray fine-tune saves once, at its end (training/ray_finetune.py: rank 0's model state dict): no interval to fit.
"""

from __future__ import annotations

import dataclasses

from infra.spec import Environment, GpuNodeGroupConfig, throughput_baselines
from infra.spec.checkpoint_throughput import (
    BYTES_PER_PARAMETER,
    MODEL_SIZES,
    WRITE_FRACTION,
    CheckpointWrite,
    describe,
    step_floor_s,
    write_mb_s_per_tib,
)
from infra.spec.environments import (
    CAPACITY_BLOCK_STOP_MARGIN,
    CAPACITY_BLOCK_TERMINATION_LEAD,
    PERSISTENT_2_THROUGHPUT,
    CheckpointStorageConfig,
)
from k8s.capacity_deadline import on_block
from k8s.charts.nvrx_job import job_nodes
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.ray_spec import WorkloadError, gpu_group


def step_time(
    job: NvrxFsdpJob, environment: str, group: GpuNodeGroupConfig, nodes: int, parameters: int
) -> tuple[float, str]:
    """(seconds per step, where the figure comes from)."""
    gpu = group.instance.gpu
    assert gpu is not None  # GPU groups are validated on construction
    ranks = nodes * gpu.count
    tokens = job.batch_size * job.seq_len * ranks
    if job.step_seconds is not None:
        return job.step_seconds, "measured (NvrxFsdpJob.step_seconds)"
    measured = [
        b
        for b in throughput_baselines.load()
        if (b.environment, b.group, b.job, b.node_count) == (environment, group.name, job.name, nodes)
    ]
    if measured:
        (baseline,) = measured
        return tokens / baseline.tokens_per_s, (
            f"{tokens:,} tokens a step at the measured {baseline.tokens_per_s:,.0f} tokens/s of "
            f"infra/spec/throughput_baselines.json ({baseline.cited()})"
        )
    floor = step_floor_s(parameters=parameters, tokens_per_step=tokens, gpus=ranks, bf16_tflops=gpu.bf16_dense_tflops)
    return floor, (
        f"the fastest {ranks} x {gpu.model} can run it, 6 x {parameters:,} parameters x {tokens:,} tokens at "
        f"{gpu.bf16_dense_tflops:g} TFLOPS bf16 each, since no step time is measured: set the measured "
        "NvrxFsdpJob.step_seconds (trainctl goodput prints it) to check against the real one"
    )


def checkpoint_write(environment: Environment, job: NvrxFsdpJob) -> CheckpointWrite | None:
    """The job's save on the environment's file system; None where there is no file system or no GPU group."""
    storage = environment.add_ons.checkpoint_storage
    if storage is None or not environment.gpu_node_groups:
        return None
    group = gpu_group(environment, job.gpu_group)
    nodes = job_nodes(job, group)
    size = MODEL_SIZES.get(job.model)
    if size is None:
        raise WorkloadError(
            f"nvrx.model={job.model!r} has no parameter count in infra/spec/checkpoint_throughput.py MODEL_SIZES: "
            "add it with its source (the model card or config.json), so synth can size its checkpoint writes"
        )
    step_s, source = step_time(job, environment.name, group, nodes, size.parameters)
    return CheckpointWrite(
        state_bytes=size.parameters * BYTES_PER_PARAMETER,
        storage=storage,
        every_steps=job.checkpoint.every_steps,
        step_s=step_s,
        step_source=source,
    )


def _fixes(write: CheckpointWrite, *, interval: bool = True) -> list[str]:
    storage = write.storage
    capacity = write.capacity_gib_needed()
    per_tib = write_mb_s_per_tib(storage)
    fixes = [
        f"more capacity: add_ons.checkpoint_storage.storage_capacity_gib={capacity} ({capacity:,} GiB x {per_tib} "
        f"MB/s/TiB = {capacity / 1024 * per_tib:,.0f} MB/s)"
    ]
    tier = write.tier_needed()
    gib = storage.storage_capacity_gib
    if tier is None:
        top = max(PERSISTENT_2_THROUGHPUT)
        fixes.append(
            f"a higher throughput tier: no PERSISTENT_2 tier is enough at {gib:,} GiB ({top} MB/s/TiB gives "
            f"{gib / 1024 * top:,.0f} MB/s)"
        )
    else:
        fixes.append(
            f"a higher throughput tier: PERSISTENT_2 at {tier} MB/s/TiB (deployment=PERSISTENT_2, "
            f"throughput_per_tib={tier}: {gib / 1024 * tier:,.0f} MB/s at {gib:,} GiB)"
        )
    if not interval:
        return fixes
    steps = write.every_steps_needed()
    fixes.append(
        f"a longer interval: NvrxFsdpJob(checkpoint=CheckpointPolicy(every_steps={steps})) in k8s/nvrx_spec.py "
        f"({steps * write.step_s:,.1f} s)"
    )
    return fixes


def check_checkpoint_writes(environment: Environment, job: NvrxFsdpJob) -> None:
    """Refuses the job when its save does not fit WRITE_FRACTION of its interval on the environment's file system."""
    write = checkpoint_write(environment, job)
    if write is None:
        return
    group = gpu_group(environment, job.gpu_group)
    if not write.fits:
        _refuse_interval(environment, job, group, write)
    if on_block(group):
        _check_stop_save(job, group, write)


def _check_stop_save(job: NvrxFsdpJob, group: GpuNodeGroupConfig, write: CheckpointWrite) -> None:
    window_s = (CAPACITY_BLOCK_STOP_MARGIN - CAPACITY_BLOCK_TERMINATION_LEAD).total_seconds()
    # The window as one interval: the same rule and fixes as the interval's, but no interval fix (the last save is
    # as long whatever the interval).
    stop = dataclasses.replace(write, every_steps=1, step_s=window_s, step_source="the stop window")
    if stop.fits:
        return
    raise WorkloadError(
        f"nvrx job {job.name!r} on Capacity Block group {group.name!r} cannot save at the block's stop point in "
        f"time: its full state, {write.state_bytes / 1e9:.1f} GB, takes {write.write_s:,.0f} s at the file system's "
        f"{describe(write.storage)}, more than {WRITE_FRACTION} of the {window_s:.0f} s between the stop "
        f"({CAPACITY_BLOCK_STOP_MARGIN.total_seconds() / 60:.0f} min before the end) and the first instances' "
        f"termination ({CAPACITY_BLOCK_TERMINATION_LEAD.total_seconds() / 60:.0f} min before it; EC2 User Guide, "
        f'"Monitor Capacity Blocks using EventBridge"): it needs {stop.required_mb_s:,.0f} MB/s. Fix one of: '
        + "; ".join(_fixes(stop, interval=False))
    )


def _refuse_interval(
    environment: Environment, job: NvrxFsdpJob, group: GpuNodeGroupConfig, write: CheckpointWrite
) -> None:
    storage: CheckpointStorageConfig = write.storage
    gpu = group.instance.gpu
    assert gpu is not None
    ranks = job_nodes(job, group) * gpu.count
    raise WorkloadError(
        f"nvrx job {job.name!r} cannot checkpoint in time in environment {environment.name!r}: its full state, "
        f"{write.state_bytes / 1e9:.1f} GB ({write.state_bytes // BYTES_PER_PARAMETER:,} parameters x "
        f"{BYTES_PER_PARAMETER} bytes: float32 weights and AdamW's two moments), written by {ranks} ranks at once "
        f"({write.state_bytes / ranks / 1e9:.2f} GB each) at the file system's {describe(storage)} "
        f"takes {write.write_s:,.1f} s, more than {WRITE_FRACTION} of its {write.interval_s:,.1f} s interval "
        f"({write.every_steps} steps x {write.step_s:.4g} s; step time: {write.step_source}): it needs "
        f"{write.required_mb_s:,.0f} MB/s. Fix one of: " + "; ".join(_fixes(write))
    )

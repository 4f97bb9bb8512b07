"""Synth refuses an NVRx job whose full state its file system cannot write within WRITE_FRACTION of its checkpoint
interval (k8s/checkpoint_writes.py), naming the three fixes with numbers; dev and prod as declared pass."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import cdk8s
import pytest

from infra.spec import (
    ENVIRONMENTS,
    Capacity,
    CapacityKind,
    CheckpointStorageConfig,
    Environment,
    LustreDeployment,
    throughput_baselines,
)
from infra.spec.checkpoint_throughput import MODEL_SIZES, ModelSize
from k8s.checkpoint_writes import check_checkpoint_writes, checkpoint_write
from k8s.main import build
from k8s.nvrx_spec import CheckpointPolicy, NvrxFsdpJob
from k8s.ray_spec import WorkloadError
from tests.k8s.test_nvrx_chart import LOCK


@pytest.mark.parametrize("env", sorted(ENVIRONMENTS))
def test_the_declared_environments_checkpoint_the_job_in_time(env: str) -> None:
    write = checkpoint_write(ENVIRONMENTS[env], NvrxFsdpJob())
    assert write is not None
    assert write.fits


def test_without_a_measured_baseline_both_take_the_compute_floor() -> None:
    dev = checkpoint_write(ENVIRONMENTS["dev"], NvrxFsdpJob())
    prod = checkpoint_write(ENVIRONMENTS["prod"], NvrxFsdpJob())
    assert dev is not None
    assert prod is not None
    assert "8 x NVIDIA L4" in dev.step_source
    assert "16 x NVIDIA H100" in prod.step_source


def test_a_measured_baseline_of_the_job_on_its_group_gives_the_step_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = {
        "environment": "dev",
        "group": "g6",
        "job": "nvrx-fsdp",
        "tokens_per_s": 16384.0,
        "steps": 1995,
        "model": "Qwen/Qwen2.5-1.5B",
        "instance_type": "g6.12xlarge",
        "node_count": 2,
        "source": {
            "report": "journal.jsonl",
            "run_id": "ft-run-7",
            "run_finished": "2026-12-01T10:00:00Z",
            "fabric_gate": "PASS",
            "commit": "0123abc",
            "recorded_by": "ops",
            "recorded_at": "2026-12-01T11:00:00Z",
        },
    }
    path = tmp_path / "throughput_baselines.json"
    path.write_text(json.dumps({"baselines": [record]}))
    monkeypatch.setattr(throughput_baselines, "BASELINES_FILE", path)
    dev = checkpoint_write(ENVIRONMENTS["dev"], NvrxFsdpJob())
    assert dev is not None
    # 2 x g6.12xlarge: 8 ranks x 4 x 2048 tokens at the measured 16,384 tokens/s.
    assert dev.step_s == pytest.approx(65_536 / 16_384)
    assert "throughput_baselines.json" in dev.step_source
    assert "ft-run-7" in dev.step_source


def test_a_measured_step_time_wins() -> None:
    write = checkpoint_write(ENVIRONMENTS["prod"], NvrxFsdpJob(step_seconds=0.25))
    assert write is not None
    assert write.step_s == 0.25
    assert "step_seconds" in write.step_source


def test_a_too_short_interval_is_refused_naming_job_bytes_throughputs_and_fixes() -> None:
    job = NvrxFsdpJob(checkpoint=CheckpointPolicy(every_steps=100))
    with pytest.raises(WorkloadError) as refused:
        check_checkpoint_writes(ENVIRONMENTS["prod"], job)
    message = str(refused.value)
    for part in (
        "'nvrx-fsdp'",
        "18.5 GB",
        "1,172 MB/s",  # 4,800 GiB x 250 MB/s/TiB
        "4,832 MB/s",  # needed: 18,524.6 MB in half of 100 x 0.076682 s
        "storage_capacity_gib=21600",
        "no PERSISTENT_2 tier",
        "every_steps=413",
        "step_seconds",
    ):
        assert part in message, (part, message)


def _p5_on_scratch() -> Environment:
    prod = ENVIRONMENTS["prod"]
    scratch = CheckpointStorageConfig(
        deployment=LustreDeployment.SCRATCH_2, storage_capacity_gib=1200, throughput_per_tib=None
    )
    return dataclasses.replace(prod, add_ons=dataclasses.replace(prod.add_ons, checkpoint_storage=scratch), name="slow")


def test_synth_refuses_before_writing_any_chart() -> None:
    app = cdk8s.App()
    with pytest.raises(WorkloadError, match=r"throughput tier: .*PERSISTENT_2 at 1000 MB/s/TiB"):
        build(app, _p5_on_scratch(), LOCK)
    assert not app.charts


def _on_block(environment: Environment) -> Environment:
    (group, *others) = environment.gpu_node_groups
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end="2026-12-10T11:30Z")
    return dataclasses.replace(environment, gpu_node_groups=(dataclasses.replace(group, capacity=block), *others))


def test_on_a_capacity_block_the_stops_save_must_fit_before_the_instances_terminate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An 8B-parameter model: 96 GB a save, 819 s at dev's 117 MB/s. Its 600 steps x 10 s interval leaves the
    # write time enough; the 10 minutes between the stop and the first termination do not.
    sizes = {**MODEL_SIZES, "example/8b": ModelSize(parameters=8_000_000_000, source="a test")}
    monkeypatch.setattr("k8s.checkpoint_writes.MODEL_SIZES", sizes)
    job = NvrxFsdpJob(model="example/8b", step_seconds=10.0)
    check_checkpoint_writes(ENVIRONMENTS["dev"], job)  # not on a block: the interval alone
    with pytest.raises(WorkloadError) as refused:
        check_checkpoint_writes(_on_block(ENVIRONMENTS["dev"]), job)
    message = str(refused.value)
    for part in (
        "Capacity Block",
        "819 s",  # seconds to write 96 GB at 117 MB/s
        "600 s",  # 40 min margin - 30 min: the instances begin to terminate
        "storage_capacity_gib=",
        "PERSISTENT_2 at",
    ):
        assert part in message, (part, message)
    assert "every_steps" not in message  # a longer interval does not make the last save shorter
    check_checkpoint_writes(_on_block(ENVIRONMENTS["dev"]), NvrxFsdpJob(step_seconds=1.0))  # Qwen 1.5B: 158 s

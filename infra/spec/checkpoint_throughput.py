"""How long a checkpoint takes to write, from the job's size and its file system's throughput, and the rule it must
meet: the full state, written by every rank at once, within WRITE_FRACTION of the checkpoint interval.
k8s/checkpoint_writes.py applies the rule at synth; `trainctl goodput --env` compares measured saves with write_mb_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from infra.spec.environments import (
    PERSISTENT_2_THROUGHPUT,
    CheckpointStorageConfig,
    LustreDeployment,
    lustre_size_at_least,
)

# What one checkpoint holds per parameter with this platform's trainer: training/fsdp.py loads the weights in float32
# and FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16) casts them for compute only (no bf16 copy is kept or saved);
# training/nvrx_fsdp.py's optimizer is torch.optim.AdamW, two float32 moments (exp_avg, exp_avg_sq) per parameter.
# The DCP save (training/checkpointing.py: the model's and the optimizer's state dicts) is 4 + 4 + 4 bytes a
# parameter; the per-rank extras (step, RNG) and the metadata are kilobytes.
BYTES_PER_PARAMETER = 12

# A save must be written within this fraction of the interval between saves. The async saver writes while training
# goes on, and the next save first waits for the previous one (training/savers.py TorchAsyncSaver.save), so 1.0
# is where saves pile up and stall the loop. Half leaves the file system room for the other half of its work in that
# interval: reading the save back to verify it (as many bytes again, issue 36), a restarting rank's model load and data
# reads, the Ray fine-tune on the same file system, and a write baseline that a busy file system does not exceed.
WRITE_FRACTION = 0.5

# FSx for Lustre User Guide, "Performance characteristics of SSD and HDD storage classes" (the SSD table): SCRATCH_2's
# disk throughput baseline is 200 MBps/TiB for reads but 100 MBps/TiB for writes (its network baseline, 200, is
# the figure usually quoted); PERSISTENT_2's disk baseline is its PerUnitStorageThroughput tier, for reads and writes.
# Bursts above the baselines run on credits and are not counted on. MB: 10^6 bytes; TiB: 1024 GiB.
SCRATCH_2_WRITE_MB_S_PER_TIB = 100


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    parameters: int
    source: str


MODEL_SIZES: MappingProxyType[str, ModelSize] = MappingProxyType(
    {
        "Qwen/Qwen2.5-1.5B": ModelSize(
            parameters=1_543_714_304,
            source="Qwen/Qwen2.5-1.5B model card (1.54B parameters, 1.31B non-embedding) and its config.json: "
            "hidden 1536, intermediate 8960, 28 layers, 12 query / 2 KV heads of 128, vocabulary 151936, tied "
            "embeddings, q/k/v biases: 151936 x 1536 + 28 x 46,797,824 + 1536",
        ),
    }
)


def write_mb_s_per_tib(storage: CheckpointStorageConfig) -> int:
    if storage.deployment is LustreDeployment.SCRATCH_2:
        return SCRATCH_2_WRITE_MB_S_PER_TIB
    assert storage.throughput_per_tib is not None  # PERSISTENT_2 is validated with a tier
    return storage.throughput_per_tib


def write_mb_s(storage: CheckpointStorageConfig) -> float:
    """The file system's write baseline, MB/s: capacity in TiB x the write figure per TiB."""
    return storage.storage_capacity_gib / 1024 * write_mb_s_per_tib(storage)


def describe(storage: CheckpointStorageConfig) -> str:
    return (
        f"{storage.deployment.value}, {storage.storage_capacity_gib:,} GiB x {write_mb_s_per_tib(storage)} "
        f"MB/s/TiB write baseline = {write_mb_s(storage):,.0f} MB/s"
    )


def step_floor_s(*, parameters: int, tokens_per_step: int, gpus: int, bf16_tflops: float) -> float:
    """The fastest one training step can be: 6 FLOPs a parameter and token (forward 2, backward 4; attention scores
    add more) at every GPU's dense bf16 peak. A save that fits the interval at this speed fits at any real one."""
    return 6 * parameters * tokens_per_step / (gpus * bf16_tflops * 1e12)


@dataclass(frozen=True, kw_only=True)
class CheckpointWrite:
    """One job's save on one file system: `state_bytes` every `every_steps` steps of `step_s` seconds (where that
    step time comes from: `step_source`)."""

    state_bytes: int
    storage: CheckpointStorageConfig
    every_steps: int
    step_s: float
    step_source: str = ""

    @property
    def write_mb_s(self) -> float:
        return write_mb_s(self.storage)

    @property
    def write_s(self) -> float:
        return self.state_bytes / 1e6 / self.write_mb_s

    @property
    def interval_s(self) -> float:
        return self.every_steps * self.step_s

    @property
    def budget_s(self) -> float:
        return WRITE_FRACTION * self.interval_s

    @property
    def required_mb_s(self) -> float:
        return self.state_bytes / 1e6 / self.budget_s

    @property
    def fits(self) -> bool:
        return self.write_s <= self.budget_s

    def capacity_gib_needed(self) -> int:
        """The smallest FSx size whose write baseline, at the current figure per TiB, is enough."""
        return lustre_size_at_least(self.required_mb_s / write_mb_s_per_tib(self.storage) * 1024)

    def tier_needed(self) -> int | None:
        """The smallest PERSISTENT_2 tier that is enough at the current capacity; None if none is."""
        tib = self.storage.storage_capacity_gib / 1024
        return next((tier for tier in PERSISTENT_2_THROUGHPUT if tib * tier >= self.required_mb_s), None)

    def every_steps_needed(self) -> int:
        """The fewest steps between saves for which the write fits."""
        return math.ceil(self.write_s / (WRITE_FRACTION * self.step_s))

"""The checkpoint-write arithmetic against hand-computed figures (infra/spec/checkpoint_throughput.py)."""

from __future__ import annotations

import pytest

from infra.spec import CheckpointStorageConfig, LustreDeployment
from infra.spec.checkpoint_throughput import (
    BYTES_PER_PARAMETER,
    MODEL_SIZES,
    WRITE_FRACTION,
    CheckpointWrite,
    step_floor_s,
    write_mb_s,
)
from infra.spec.instances import INSTANCE_TYPES

SCRATCH = CheckpointStorageConfig(
    deployment=LustreDeployment.SCRATCH_2, storage_capacity_gib=1200, throughput_per_tib=None
)
P2_250 = CheckpointStorageConfig(
    deployment=LustreDeployment.PERSISTENT_2, storage_capacity_gib=4800, throughput_per_tib=250
)


def test_qwen_1_5b_has_the_parameters_its_config_gives() -> None:
    # Qwen/Qwen2.5-1.5B config.json: hidden 1536, intermediate 8960, 28 layers, 12 query heads and 2 KV heads of 128,
    # vocabulary 151936, tied embeddings, biases on q/k/v only.
    hidden, inter, layers, kv, vocab = 1536, 8960, 28, 2 * 128, 151936
    attention = (hidden * hidden + hidden) + 2 * (hidden * kv + kv) + hidden * hidden
    layer = attention + 3 * hidden * inter + 2 * hidden
    assert MODEL_SIZES["Qwen/Qwen2.5-1.5B"].parameters == vocab * hidden + layers * layer + hidden == 1_543_714_304


def test_the_trainer_saves_twelve_bytes_a_parameter() -> None:
    # float32 weights (training/fsdp.py) + AdamW's exp_avg and exp_avg_sq in float32.
    assert BYTES_PER_PARAMETER == 4 + 4 + 4


def test_write_throughput_is_the_write_baseline_times_the_capacity() -> None:
    # SCRATCH_2 writes at 100 MB/s/TiB (its disk baseline: 200 read, 100 write); 1200 GiB = 1.171875 TiB.
    assert write_mb_s(SCRATCH) == pytest.approx(117.1875)
    # PERSISTENT_2 at its tier: 4800 GiB = 4.6875 TiB x 250.
    assert write_mb_s(P2_250) == pytest.approx(1171.875)


def test_the_step_floor_is_six_flops_a_parameter_and_token_at_the_bf16_peak() -> None:
    h100 = INSTANCE_TYPES["p5.48xlarge"].gpu
    assert h100 is not None
    assert h100.bf16_dense_tflops == 989.5
    # 2 x p5: 16 ranks x 4 x 2048 tokens; 6 x 1,543,714,304 x 131,072 / (16 x 989.5e12).
    floor = step_floor_s(parameters=1_543_714_304, tokens_per_step=131_072, gpus=16, bf16_tflops=989.5)
    assert floor == pytest.approx(0.076_682, rel=1e-4)


def test_a_save_that_does_not_fit_names_the_three_fixes_with_numbers() -> None:
    state = 1_543_714_304 * 12  # 18,524,571,648 bytes
    write = CheckpointWrite(state_bytes=state, storage=P2_250, every_steps=100, step_s=0.0767)
    assert WRITE_FRACTION == 0.5
    assert write.write_s == pytest.approx(18_524.571648 / 1171.875)  # 15.81 s
    assert write.interval_s == pytest.approx(7.67)
    assert not write.fits
    assert write.required_mb_s == pytest.approx(18_524.571648 / 3.835)  # 4,830 MB/s in half of 7.67 s
    # 4,830 MB/s at 250 MB/s/TiB: 19.32 TiB = 19,785 GiB, the next FSx size 21,600 GiB.
    assert write.capacity_gib_needed() == 21_600
    # 4,800 GiB at 1000 MB/s/TiB gives 4,687.5 MB/s: no tier is enough.
    assert write.tier_needed() is None
    # 15.81 s / (0.5 x 0.0767 s) = 412.2 steps.
    assert write.every_steps_needed() == 413


def test_a_save_that_fits_needs_no_fix() -> None:
    write = CheckpointWrite(state_bytes=1_543_714_304 * 12, storage=SCRATCH, every_steps=100, step_s=3.866)
    # 158.1 s of 386.6 s: under half.
    assert write.write_s == pytest.approx(158.08, rel=1e-3)
    assert write.fits
    assert write.every_steps_needed() == 82


def test_a_tier_fix_on_scratch_is_persistent_2_at_the_smallest_tier_that_is_enough() -> None:
    write = CheckpointWrite(state_bytes=1_543_714_304 * 12, storage=SCRATCH, every_steps=50, step_s=3.866)
    # 18,524.6 MB in 96.65 s: 191.7 MB/s, more than 117.2; PERSISTENT_2 at 1200 GiB: 125 -> 146.5, 250 -> 293.
    assert not write.fits
    assert write.tier_needed() == 250
    assert write.capacity_gib_needed() == 2400

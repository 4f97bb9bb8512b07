"""The probe's pieces in-process: sweep, known values and their check, backend choice, and a sweep on a
one-rank gloo group whose all-reduce is made to corrupt an element."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from training.fabric_probe import (
    DevicePlan,
    DistEnv,
    ProbeConfig,
    check_tolerance,
    count_wrong,
    expected_pattern,
    fill_periodic,
    parse_args,
    plan_device,
    rank_pattern,
    read_dist_env,
    run_sweep,
    sweep_sizes,
)
from training.nccl_tests import ExitCode, bus_bandwidth_factor, evaluate

GIB = 1 << 30


def test_default_sweep_is_8_bytes_to_1_gib_doubling() -> None:
    args = parse_args([])
    assert args.sizes == tuple(8 << k for k in range(28))
    assert args.sizes[-1] == GIB
    assert (args.iters, args.warmup, args.dtype, args.floor_gbps) == (20, 5, "float32", None)


def test_sweep_factor_sizes_and_rounding_to_whole_elements() -> None:
    assert sweep_sizes(8, 1 << 20, 4, 4) == [8 << (2 * k) for k in range(9)]
    assert parse_args(["--min-bytes", "1K", "--max-bytes", "1M", "--factor", "32"]).sizes == (1024, 32768, 1 << 20)
    assert sweep_sizes(6, 48, 2, 4) == [4, 12, 24, 48]
    with pytest.raises(ValueError, match="factor must be at least 2"):
        sweep_sizes(8, 64, 1, 4)
    with pytest.raises(ValueError, match="less than one 4-byte element"):
        sweep_sizes(2, 64, 2, 4)


def test_bad_arguments_exit_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--max-bytes", "256M", "--floor-gbps", "349.6", "--floor-min-bytes", "1G"])
    assert exc.value.code == ExitCode.USAGE
    assert "below --floor-min-bytes 1073741824 B" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--floor-gbps", "-1"])


@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (3, 4 / 3), (8, 1.75), (16, 1.875), (64, 1.96875)])
def test_bus_bandwidth_factor_is_nccl_tests_2_n_minus_1_over_n(n: int, factor: float) -> None:
    assert bus_bandwidth_factor(n) == pytest.approx(factor, rel=1e-15)


def test_expected_values_are_the_sum_of_every_rank_pattern() -> None:
    assert rank_pattern(0) == [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert rank_pattern(1) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0]
    assert expected_pattern(2) == [3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 3.0]
    assert expected_pattern(16)[0] == 16 + 3  # ranks 0, 7 and 14 add one at index 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_check_counts_exactly_the_wrong_elements(dtype: torch.dtype) -> None:
    world = 5
    expected = torch.tensor(expected_pattern(world))
    buf = torch.empty(1000, dtype=dtype)
    fill_periodic(buf, expected.to(dtype))
    assert buf[7 * 142 + 3].item() == expected[3].item()  # tail element, past the last whole period
    assert count_wrong(buf, expected, check_tolerance(dtype, world)) == 0
    buf[3] += 1  # a doubled contribution
    buf[998] -= 1  # a missing one, in the tail
    assert count_wrong(buf, expected, check_tolerance(dtype, world)) == 2
    # A sum without one rank's contribution is wrong wherever that rank's pattern is nonzero: everywhere.
    partial = torch.empty(1000, dtype=dtype)
    fill_periodic(partial, torch.tensor(expected_pattern(world - 1), dtype=dtype))
    assert count_wrong(partial, expected, check_tolerance(dtype, world)) == 1000
    # With a tolerance (large worlds in bfloat16) small rounding passes and a missing contribution does not.
    near = buf.float()
    near[10] += 0.25
    assert count_wrong(near, expected, 0.5) == 2
    assert count_wrong(near, expected, 0.0) == 3


def test_tolerance_is_zero_while_sums_are_exact() -> None:
    assert check_tolerance(torch.bfloat16, 128) == 0.0  # partial sums <= 256: exact in bfloat16
    assert check_tolerance(torch.float32, 4096) == 0.0
    assert check_tolerance(torch.bfloat16, 256) > 0.0


def test_dist_env_needs_the_torchrun_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "MASTER_ADDR": "head", "MASTER_PORT": "29500"}
    assert read_dist_env(env) == DistEnv(rank=3, world_size=16, local_rank=3)
    with pytest.raises(SystemExit, match="LOCAL_RANK, MASTER_PORT not set; launch with torchrun"):
        read_dist_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "head"})
    with pytest.raises(SystemExit, match="outside WORLD_SIZE"):
        read_dist_env(env | {"RANK": "16"})


def test_backend_and_device_come_from_one_choice() -> None:
    assert plan_device(3, "cpu") == DevicePlan(backend="gloo", device=torch.device("cpu"))
    if torch.cuda.is_available():
        assert plan_device(0, "auto") == DevicePlan(backend="nccl", device=torch.device("cuda", 0))
    else:
        assert plan_device(0, "auto").backend == "gloo"
        with pytest.raises(SystemExit, match="CUDA is not available"):
            plan_device(0, "cuda")


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[DistEnv]:
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        yield DistEnv(rank=0, world_size=1, local_rank=0)
    finally:
        dist.destroy_process_group()


def test_a_corrupting_all_reduce_is_flagged(one_rank_group: DistEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    real_all_reduce = dist.all_reduce

    def corrupting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = real_all_reduce(tensor, *args, **kwargs)
        if tensor.dtype == torch.float32:  # the data buffer; times and counts are float64 / int64
            tensor[0] += 1
        return work

    monkeypatch.setattr(dist, "all_reduce", corrupting)  # the module fabric_probe calls through
    config = ProbeConfig(sizes=(8, 64, 1024), dtype_name="float32", iters=2, warmup=0)
    seen: list[int] = []
    report = run_sweep(config, plan_device(0, "cpu"), one_rank_group, on_result=lambda r: seen.append(r.size_bytes))
    assert seen == [8, 64, 1024]
    assert [r.wrong for r in report.results] == [1, 1, 1]
    code, _, messages = evaluate(report, 0.0, None)
    assert code == ExitCode.WRONG_RESULTS
    assert messages[0] == "FABRIC CHECK FAILED: 3 wrong elements in all-reduce results at sizes 8, 64, 1024 B"


def test_an_honest_one_rank_sweep_is_correct(one_rank_group: DistEnv) -> None:
    config = ProbeConfig(sizes=(8, 4096), dtype_name="bfloat16", iters=2, warmup=1)
    report = run_sweep(config, plan_device(0, "cpu"), one_rank_group)
    assert report.wrong_total == 0
    assert [r.count for r in report.results] == [4, 2048]
    # One rank moves nothing over a bus: busbw = algbw * 0.
    assert [r.busbw_gbps for r in report.results] == [0.0, 0.0]

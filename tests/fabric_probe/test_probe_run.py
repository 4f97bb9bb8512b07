"""The probe as real processes on gloo: three ranks launched directly (the torchrun environment contract,
each rank's own exit code visible) and two under torchrun itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fabric_probe.helpers import MEASUREMENT_KEYS, REPO, REPORT_KEYS, RESULT_KEYS
from tests.tiers import starts_training_processes
from training.nccl_tests import ExitCode, parse_all_reduce_perf

TIMEOUT_S = 150
SMALL_SWEEP = ["--min-bytes", "8", "--max-bytes", "4M", "--iters", "5", "--warmup", "1", "--timeout-s", "60"]
SIZES_X2 = [8 << k for k in range(20)]  # 8 B .. 4 MiB, doubling
SIZES_X4 = [8 << (2 * k) for k in range(10)]  # 8 B .. 2 MiB, x4 (8 MiB would pass 4 MiB)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    return env


@dataclass(frozen=True)
class DirectRun:
    world_size: int
    returncodes: list[int]
    rank0_stdout: str
    others_stdout: list[str]
    report: dict[str, Any]


@pytest.fixture(scope="module")
@starts_training_processes
def direct_run(tmp_path_factory: pytest.TempPathFactory) -> DirectRun:
    """Three ranks started as plain processes with an unreachable floor: the run must fail the floor."""
    world_size = 3
    out = tmp_path_factory.mktemp("direct") / "nested" / "report.json"
    port = _free_port()
    procs = []
    for rank in range(world_size):
        env = _base_env() | {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        cmd = [sys.executable, "-m", "training.fabric_probe", *SMALL_SWEEP]
        cmd += ["--device", "cpu", "--floor-gbps", "1e9", "--output-json", str(out)]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = []
    try:
        for proc in procs:
            stdout, _ = proc.communicate(timeout=TIMEOUT_S)
            outputs.append(stdout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert out.exists(), "rank 0 wrote no JSON report:\n" + outputs[0]
    return DirectRun(
        world_size=world_size,
        returncodes=[p.returncode for p in procs],
        rank0_stdout=outputs[0],
        others_stdout=outputs[1:],
        report=json.loads(out.read_text()),
    )


def test_every_rank_exits_with_the_floor_code(direct_run: DirectRun) -> None:
    assert direct_run.returncodes == [ExitCode.BELOW_FLOOR] * direct_run.world_size, direct_run.rank0_stdout


def test_floor_failure_is_logged_once_by_rank_0(direct_run: DirectRun) -> None:
    failed = [line for line in direct_run.rank0_stdout.splitlines() if line.startswith("FABRIC CHECK FAILED")]
    assert len(failed) == 1
    assert "bus bandwidth" in failed[0]
    assert "at 4194304 B (4 MiB) below floor 1e+09 GB/s" in failed[0]
    assert "FABRIC CHECK PASSED" not in direct_run.rank0_stdout
    assert not any("FABRIC CHECK" in out for out in direct_run.others_stdout)


def test_sizes_are_the_requested_sweep(direct_run: DirectRun) -> None:
    report = direct_run.report
    assert report["sizes"] == SIZES_X2
    assert [r["size_bytes"] for r in report["results"]] == SIZES_X2
    assert [r["count"] for r in report["results"]] == [s // 4 for s in SIZES_X2]
    assert all(b > a for a, b in zip(report["sizes"], report["sizes"][1:], strict=False))


def test_busbw_is_algbw_times_the_all_reduce_factor(direct_run: DirectRun) -> None:
    n = direct_run.world_size
    for row in direct_run.report["results"]:
        m = row["in_place"]
        assert m["algbw_gbps"] == pytest.approx(row["size_bytes"] / (m["time_us"] * 1e-6) / 1e9, rel=1e-12)
        assert m["busbw_gbps"] / m["algbw_gbps"] == pytest.approx(2 * (n - 1) / n, rel=1e-12)


def test_results_are_correct(direct_run: DirectRun) -> None:
    report = direct_run.report
    assert [r["in_place"]["wrong"] for r in report["results"]] == [0] * len(SIZES_X2)
    assert report["wrong_total"] == 0
    assert "# Out of bounds values : 0 OK" in direct_run.rank0_stdout


def test_json_report_shape(direct_run: DirectRun) -> None:
    report = direct_run.report
    assert set(report) == REPORT_KEYS
    assert report["source"] == "fabric_probe"
    assert report["backend"] == "gloo"
    assert report["world_size"] == direct_run.world_size
    assert report["exit_code"] == ExitCode.BELOW_FLOOR
    assert report["floor"]["passed"] is False
    assert report["floor"]["floor_gbps"] == 1e9
    assert report["params"] == {
        "device": "cpu",
        "dtype": "float32",
        "min_bytes": 8,
        "max_bytes": 4 << 20,
        "iters": 5,
        "warmup": 1,
    }
    for row in report["results"]:
        assert set(row) == RESULT_KEYS
        assert row["out_of_place"] is None  # torch's all_reduce is in place
        assert set(row["in_place"]) == MEASUREMENT_KEYS
        assert row["in_place"]["time_us"] > 0
    busbw = [r["in_place"]["busbw_gbps"] for r in report["results"]]
    assert report["peak_busbw_gbps"] == max(busbw)
    assert report["large_message_bytes"] == SIZES_X2[-1]
    assert report["large_message_busbw_gbps"] == busbw[-1]
    assert report["avg_busbw_gbps"] == pytest.approx(sum(busbw) / len(busbw))


def test_printed_table_is_nccl_tests_format(direct_run: DirectRun) -> None:
    """The probe's table reads back through the nccl-tests parser to the numbers in its JSON."""
    parsed = parse_all_reduce_perf(direct_run.rank0_stdout)
    assert parsed.sizes == SIZES_X2
    for row, json_row in zip(parsed.results, direct_run.report["results"], strict=True):
        assert row.out_of_place is not None
        assert row.out_of_place.busbw_gbps is None
        assert row.in_place is not None
        assert row.in_place.busbw_gbps == pytest.approx(json_row["in_place"]["busbw_gbps"], abs=0.005)
        assert row.in_place.wrong == 0
    assert parsed.avg_busbw_gbps == pytest.approx(direct_run.report["avg_busbw_gbps"], rel=1e-5)


@pytest.mark.training
def test_torchrun_bfloat16_x4_sweep_passes_a_zero_floor(tmp_path: Path) -> None:
    out = tmp_path / "torchrun.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    cmd += ["-m", "training.fabric_probe", *SMALL_SWEEP, "--factor", "4", "--dtype", "bfloat16"]
    cmd += ["--device", "cpu", "--floor-gbps", "0", "--output-json", str(out)]
    proc = subprocess.run(
        cmd, cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "FABRIC CHECK PASSED: bus bandwidth" in proc.stdout
    assert "meets floor 0 GB/s" in proc.stdout
    report = json.loads(out.read_text())
    assert report["world_size"] == 2
    assert report["sizes"] == SIZES_X4
    assert [r["count"] for r in report["results"]] == [s // 2 for s in SIZES_X4]
    assert {r["type"] for r in report["results"]} == {"bfloat16"}
    assert report["wrong_total"] == 0
    assert report["exit_code"] == 0
    assert report["floor"]["passed"] is True
    for row in report["results"]:  # 2 ranks: busbw = algbw * 2(2-1)/2 = algbw
        assert row["in_place"]["busbw_gbps"] == row["in_place"]["algbw_gbps"]

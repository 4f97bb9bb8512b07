"""The nccl-tests all_reduce_perf parser on output modeled on real runs: 2 x p5.48xlarge on EFA (the published
rows) and a TCP-sockets run under mpirun --tag-output with validation off, and the floor decided with the
floors of infra/spec/fabric_floors.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.spec.fabric_floors import floor_gbps, floor_message_bytes
from tests.fabric_probe.helpers import FIXTURES, MEASUREMENT_KEYS, REPORT_KEYS, RESULT_KEYS, fixture_text
from training.nccl_tests import (
    AllReduceReport,
    ExitCode,
    check_floor,
    format_table,
    main,
    parse_all_reduce_perf,
    parse_row,
    parse_size,
    strip_prefix,
)

EFA_LOG = "p5_2node_efa.log"
TCP_LOG = "p5_2node_tcp_tagged.log"
GIB = 1 << 30
P5 = "p5.48xlarge"


@pytest.fixture(scope="module")
def efa() -> AllReduceReport:
    return parse_all_reduce_perf(fixture_text(EFA_LOG))


@pytest.fixture(scope="module")
def tcp() -> AllReduceReport:
    return parse_all_reduce_perf(fixture_text(TCP_LOG))


def _row(report: AllReduceReport, size: int) -> tuple[float | None, ...]:
    (row,) = [r for r in report.results if r.size_bytes == size]
    assert row.out_of_place is not None
    assert row.in_place is not None
    o, i = row.out_of_place, row.in_place
    return (o.time_us, o.algbw_gbps, o.busbw_gbps, o.wrong, i.time_us, i.algbw_gbps, i.busbw_gbps, i.wrong)


def test_efa_run_rows_and_header(efa: AllReduceReport) -> None:
    assert efa.sizes == [8 << k for k in range(32)]  # 8 B .. 16 GiB
    assert [r.count for r in efa.results] == [s // 4 for s in efa.sizes]
    assert {(r.type, r.redop, r.root) for r in efa.results} == {("float", "sum", -1)}
    assert efa.world_size == 16  # from the "#  Rank NN Group ..." lines
    assert efa.backend == "nccl"
    assert efa.params == {
        "nthread": 1,
        "ngpus": 1,
        "min_bytes": 8,
        "max_bytes": 17179869184,
        "warmup": 5,
        "iters": 20,
        "out_of_bounds": 0,
    }
    assert _row(efa, 8) == (69.12, 0.00, 0.00, 0, 72.43, 0.00, 0.00, 0)
    assert _row(efa, GIB) == (4607.6, 233.04, 436.95, 0, 4565.6, 235.18, 440.96, 0)
    assert _row(efa, 2 * GIB) == (9074.5, 236.65, 443.72, 0, 9108.5, 235.77, 442.06, 0)
    assert _row(efa, 16 * GIB) == (66132, 259.78, 487.09, 0, 66109, 259.87, 487.26, 0)


def test_efa_run_summary(efa: AllReduceReport) -> None:
    assert efa.reported_avg_busbw_gbps == 124.536
    assert efa.avg_busbw_gbps == 124.536
    assert efa.wrong_total == 0
    assert efa.peak_busbw_gbps == 487.26
    assert efa.large_message_busbw_gbps == 487.26  # the better of out-of-place and in-place at 16 GiB
    # busbw = algbw * 2(n-1)/n with n = 16, within the rounding of the two printed decimals (0.005 * 2.875)
    for row in efa.results[-8:]:
        for m in row.measurements:
            assert m.busbw_gbps is not None
            assert m.algbw_gbps is not None
            assert m.busbw_gbps == pytest.approx(m.algbw_gbps * 1.875, abs=0.015)


def test_avg_bus_bandwidth_is_the_mean_over_both_placements(efa: AllReduceReport) -> None:
    values = [m.busbw_gbps for r in efa.results for m in r.measurements if m.busbw_gbps is not None]
    assert len(values) == 64
    assert sum(values) / len(values) == pytest.approx(124.536, abs=5e-4)


@pytest.mark.parametrize(
    "prefix",
    ["[1,0]<stdout>:", "[1,0]<stdout>: ", "0: ", " 0: "],
    ids=["openmpi-tag-output", "openmpi5-tag-output", "srun-label", "srun-label-padded"],
)
def test_prefixed_output_parses_like_the_plain_output(efa: AllReduceReport, prefix: str) -> None:
    lines = fixture_text(EFA_LOG).splitlines()
    tagged = [prefix + line for line in lines]
    # Other ranks' stderr interleaved, as mpirun --tag-output shows it.
    tagged.insert(
        40, "[1,9]<stderr>:p5-st-p5-2:39985:40050 [1] NCCL INFO Channel 03/0 : 9[1] -> 1[1] [send] via NET/Libfabric/1"
    )
    assert parse_all_reduce_perf(tagged) == efa


def test_strip_prefix_leaves_unprefixed_rows_alone() -> None:
    row = (
        "           8             2     float     sum      -1"
        "    69.12    0.00    0.00      0    72.43    0.00    0.00      0"
    )
    assert strip_prefix(row) == row
    assert strip_prefix("[1,12]<stderr>:# Avg bus bandwidth    : 1.5 ") == "# Avg bus bandwidth    : 1.5"


def test_tcp_run_with_validation_off(tcp: AllReduceReport) -> None:
    assert tcp.sizes == [8 << k for k in range(28)]  # 8 B .. 1 GiB
    assert tcp.world_size == 16
    assert tcp.params["max_bytes"] == GIB
    assert _row(tcp, GIB) == (435125, 2.47, 4.63, None, 431644, 2.49, 4.66, None)  # #wrong N/A
    assert tcp.wrong_total == 0
    assert tcp.avg_busbw_gbps == 1.74259
    assert tcp.large_message_busbw_gbps == 4.66


def test_floor_decision_with_the_p5_floor(efa: AllReduceReport, tcp: AllReduceReport) -> None:
    floor, min_bytes = floor_gbps(P5), floor_message_bytes(P5)
    passed = check_floor(efa, floor, min_bytes=min_bytes)
    assert passed.passed
    assert passed.code == ExitCode.OK
    assert passed.message == (
        f"FABRIC CHECK PASSED: bus bandwidth 487.26 GB/s at 17179869184 B (16 GiB) meets floor {floor:g} GB/s"
    )
    # The TCP run ends at 1 GiB, under the 2 GiB the floor applies from; at its last size it is far below anyway.
    assert check_floor(tcp, floor, min_bytes=min_bytes).code == ExitCode.SWEEP_TOO_SHORT
    failed = check_floor(tcp, floor)
    assert not failed.passed
    assert failed.code == ExitCode.BELOW_FLOOR
    assert failed.message == (
        f"FABRIC CHECK FAILED: bus bandwidth 4.66 GB/s at 1073741824 B (1 GiB) below floor {floor:g} GB/s"
    )


def test_the_p5_floor_needs_the_sweep_to_reach_2_gib(efa: AllReduceReport) -> None:
    up_to_1g = AllReduceReport(
        source="nccl-tests", backend="nccl", world_size=16, results=efa.results[: efa.sizes.index(2 * GIB)]
    )
    assert up_to_1g.sizes[-1] == GIB
    verdict = check_floor(up_to_1g, floor_gbps(P5), min_bytes=floor_message_bytes(P5))
    assert verdict.code == ExitCode.SWEEP_TOO_SHORT
    assert "sweep ends at 1073741824 B (1 GiB), below the 2147483648 B (2 GiB)" in verdict.message
    # Without the size rule, 1 GiB of this (Slurm) run (436.95 GB/s) would still pass; 512 MiB (393.34) too, and
    # 256 MiB (346.46) would not.
    assert check_floor(up_to_1g, floor_gbps(P5)).passed
    up_to_256m = AllReduceReport(source="nccl-tests", backend="nccl", world_size=16, results=efa.results[:26])
    assert not check_floor(up_to_256m, floor_gbps(P5)).passed


def test_na_bus_bandwidth_at_the_largest_size_fails_the_floor() -> None:
    text = "\n".join(
        [
            "#       size         count      type   redop    root"
            "     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
            "     1048576        262144     float     sum      -1"
            "    123.2    8.51   15.95      0    121.3    8.64   16.21      0",
            "     2097152        524288     float     sum      -1"
            "      N/A     N/A     N/A    N/A      N/A     N/A     N/A    N/A",
        ]
    )
    report = parse_all_reduce_perf(text)
    assert report.results[-1].busbw_gbps is None
    assert report.peak_busbw_gbps == 16.21
    assert report.reported_avg_busbw_gbps is None
    assert report.avg_busbw_gbps == pytest.approx((15.95 + 16.21) / 2)
    verdict = check_floor(report, 1.0)
    assert verdict.code == ExitCode.BELOW_FLOOR
    assert "bus bandwidth N/A at 2097152 B (2 MiB) below floor 1 GB/s (not measured)" in verdict.message


def test_row_variants() -> None:
    # Older releases: no root column, and a max-error column instead of #wrong (starred over the threshold).
    old = parse_row(
        "    33554432       8388608     float     sum    439.7   76.31  143.09  0e+00    417.7   80.33  150.62  2e-07*"
    )
    assert old is not None
    assert (old.root, old.count) == (-1, 8388608)
    assert old.out_of_place is not None
    assert old.out_of_place.wrong is None
    assert old.in_place is not None
    assert old.in_place.wrong == 1
    # Newer releases print -1 for #wrong when validation is off.
    newer = parse_row(
        "           8             2  bfloat16     sum      -1    69.12    0.00    0.00     -1    72.43    0.00    0.00"
        "     -1"
    )
    assert newer is not None
    assert newer.type == "bfloat16"
    assert newer.wrong == 0
    assert newer.in_place is not None
    assert newer.in_place.wrong is None
    # Not rows: NCCL INFO lines, headers, truncated rows.
    assert parse_row("p5-st-p5-1:41207:41263 [0] NCCL INFO Using network Libfabric") is None
    assert parse_row("           8             2     float     sum      -1    69.12    0.00") is None
    assert (
        parse_row("           8             2     float     sum      -1    69.12    x.00    0.00      0  1  2  3  0")
        is None
    )


def test_wrong_elements_fail_the_cli_whatever_the_bandwidth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = fixture_text(EFA_LOG).splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.lstrip().startswith("4194304 ")]
    lines[at] = lines[at][:-1] + "3"  # in-place #wrong 0 -> 3
    lines = [line.replace("Out of bounds values : 0 OK", "Out of bounds values : 1 FAILED") for line in lines]
    log = tmp_path / "corrupt.log"
    log.write_text("\n".join(lines))
    assert main([str(log), "--floor-gbps", "0"]) == ExitCode.WRONG_RESULTS
    out = capsys.readouterr().out
    assert "FABRIC CHECK FAILED: 3 wrong elements in all-reduce results at sizes 4194304 B" in out
    assert "# Out of bounds values : 1 FAILED" in out


def test_cli_prints_the_table_and_passes_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(FIXTURES / EFA_LOG), "--floor-gbps", str(floor_gbps(P5)), "--floor-min-bytes", "1G"]) == 0
    out = capsys.readouterr().out
    assert "  1073741824     268435456     float     sum      -1   4607.6  233.04  436.95      0" in out
    assert " 17179869184    4294967296     float     sum      -1    66132  259.78  487.09      0    66109" in out
    assert "# Avg bus bandwidth    : 124.536" in out
    assert out.rstrip().endswith("meets floor 350.2 GB/s")


def test_cli_json_has_the_probe_report_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(FIXTURES / TCP_LOG), "--json", "--floor-gbps", str(floor_gbps(P5))]) == ExitCode.BELOW_FLOOR
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert set(report) == REPORT_KEYS
    assert all(set(r) == RESULT_KEYS for r in report["results"])
    assert all(set(r["out_of_place"]) == MEASUREMENT_KEYS for r in report["results"])
    assert report["source"] == "nccl-tests"
    assert report["world_size"] == 16
    assert report["exit_code"] == ExitCode.BELOW_FLOOR
    assert report["large_message_busbw_gbps"] == 4.66
    assert report["floor"]["passed"] is False
    assert "FABRIC CHECK FAILED: bus bandwidth 4.66 GB/s" in captured.err


def test_cli_without_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("# nThread 1 nGpus 1 minBytes 8 maxBytes 1024\nNCCL WARN something failed\n")
    assert main([str(empty), "--floor-gbps", "1"]) == ExitCode.NO_RESULTS
    assert "no all_reduce_perf result rows found" in capsys.readouterr().err


def test_two_runs_in_one_log_are_refused() -> None:
    text = fixture_text(EFA_LOG) + fixture_text(EFA_LOG)
    with pytest.raises(ValueError, match="more than one result table"):
        parse_all_reduce_perf(text)


def test_table_round_trip(efa: AllReduceReport, tcp: AllReduceReport) -> None:
    for report in (efa, tcp):
        again = parse_all_reduce_perf(format_table(report))
        assert again.results == report.results
        assert again.reported_avg_busbw_gbps == report.avg_busbw_gbps


@pytest.mark.parametrize(
    ("text", "size"), [("8", 8), ("256M", 256 << 20), ("1G", GIB), ("1.5k", 1536), ("16g", 16 * GIB)]
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_junk() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("1GB")

"""The all-reduce report that the fabric probe and NVIDIA's nccl-tests both produce, and a parser for
`all_reduce_perf` output.

    python -m training.nccl_tests all_reduce.log [--json] [--floor-gbps 350.2] [--floor-min-bytes 2G]
    mpirun ... all_reduce_perf -b 8 -e 2G -f 2 | python -m training.nccl_tests - --floor-gbps 350.2

Definitions follow nccl-tests (`src/common.cu`, `src/all_reduce.cu`, `doc/PERFORMANCE.md`):
- algbw = bytes / time, in GB/s with 1 GB = 1e9 bytes (not GiB);
- busbw = algbw * 2(n-1)/n for all-reduce over n ranks: the per-link bandwidth of a ring all-reduce,
  comparable across rank counts and with the hardware's link bandwidth;
- "# Avg bus bandwidth" = the mean of busbw over every row, out-of-place and in-place alike.

The floor rule (shared with the probe): the fabric fails when the bus bandwidth at the largest message size
of the sweep is below the floor. The probe and this module's CLI exit with the codes in `ExitCode`.

Only the standard library: this module ships in the `training-code` ConfigMap and runs where only
`training/*.py` is mounted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

GB = 1e9  # nccl-tests reports decimal GB/s
SCHEMA = "all-reduce-report/v1"


class ExitCode(IntEnum):
    """Every exit status the fabric probe and the nccl-tests CLI use. 1 stays Python's for an uncaught
    error and 2 argparse's for bad usage. Under torchrun the launcher itself exits 1 whenever a worker
    fails; the worker's own code then appears in torchrun's failure summary ("exitcode : 3") and as
    "exit_code" in the JSON report."""

    OK = 0
    USAGE = 2
    BELOW_FLOOR = 3
    WRONG_RESULTS = 4
    NO_RESULTS = 5
    SWEEP_TOO_SHORT = 6


def bus_bandwidth_factor(world_size: int) -> float:
    """nccl-tests' all-reduce factor: busbw = algbw * 2(n-1)/n."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    return 2.0 * (world_size - 1) / world_size


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One timed variant (out-of-place or in-place) at one size; None where the source printed N/A."""

    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None

    @classmethod
    def from_time(cls, *, size_bytes: int, seconds: float, world_size: int, wrong: int | None) -> Measurement:
        if seconds <= 0:
            raise ValueError(f"time per iteration must be positive, got {seconds}")
        algbw = size_bytes / seconds / GB
        return cls(
            time_us=seconds * 1e6,
            algbw_gbps=algbw,
            busbw_gbps=algbw * bus_bandwidth_factor(world_size),
            wrong=wrong,
        )


@dataclass(frozen=True, kw_only=True)
class SizeResult:
    size_bytes: int
    count: int
    type: str
    redop: str
    root: int = -1
    out_of_place: Measurement | None = None
    in_place: Measurement | None = None

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        return tuple(m for m in (self.out_of_place, self.in_place) if m is not None)

    @property
    def busbw_gbps(self) -> float | None:
        """The better of out-of-place and in-place: both measure the same fabric at this size."""
        values = [m.busbw_gbps for m in self.measurements if m.busbw_gbps is not None]
        return max(values) if values else None

    @property
    def wrong(self) -> int:
        return sum(m.wrong for m in self.measurements if m.wrong is not None)


@dataclass(frozen=True, kw_only=True)
class AllReduceReport:
    source: str
    backend: str | None
    world_size: int | None
    results: tuple[SizeResult, ...]
    # The "# Avg bus bandwidth" nccl-tests printed (computed from its unrounded values); None for the probe.
    reported_avg_busbw_gbps: float | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> list[int]:
        return [r.size_bytes for r in self.results]

    @property
    def avg_busbw_gbps(self) -> float | None:
        if self.reported_avg_busbw_gbps is not None:
            return self.reported_avg_busbw_gbps
        values = [m.busbw_gbps for r in self.results for m in r.measurements if m.busbw_gbps is not None]
        return sum(values) / len(values) if values else None

    @property
    def peak_busbw_gbps(self) -> float | None:
        values = [v for v in (r.busbw_gbps for r in self.results) if v is not None]
        return max(values) if values else None

    @property
    def largest(self) -> SizeResult | None:
        return self.results[-1] if self.results else None

    @property
    def large_message_busbw_gbps(self) -> float | None:
        """Bus bandwidth at the largest size of the sweep: the number the floor is checked against."""
        return self.largest.busbw_gbps if self.largest else None

    @property
    def wrong_total(self) -> int:
        return sum(r.wrong for r in self.results)

    @property
    def out_of_bounds(self) -> int:
        """nccl-tests' "Out of bounds values": how many timed variants had any wrong element."""
        return sum(1 for r in self.results for m in r.measurements if m.wrong)

    def to_json(self) -> dict[str, Any]:
        largest = self.largest
        return {
            "schema": SCHEMA,
            "source": self.source,
            "collective": "all_reduce",
            "backend": self.backend,
            "world_size": self.world_size,
            "params": dict(self.params),
            "sizes": self.sizes,
            "results": [
                {
                    "size_bytes": r.size_bytes,
                    "count": r.count,
                    "type": r.type,
                    "redop": r.redop,
                    "root": r.root,
                    "out_of_place": _measurement_json(r.out_of_place),
                    "in_place": _measurement_json(r.in_place),
                    "busbw_gbps": r.busbw_gbps,
                    "wrong": r.wrong,
                }
                for r in self.results
            ],
            "peak_busbw_gbps": self.peak_busbw_gbps,
            "large_message_bytes": largest.size_bytes if largest else None,
            "large_message_busbw_gbps": self.large_message_busbw_gbps,
            "avg_busbw_gbps": self.avg_busbw_gbps,
            "wrong_total": self.wrong_total,
        }


def _measurement_json(m: Measurement | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"time_us": m.time_us, "algbw_gbps": m.algbw_gbps, "busbw_gbps": m.busbw_gbps, "wrong": m.wrong}


# --- the floor rule -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FloorVerdict:
    code: ExitCode
    floor_gbps: float
    size_bytes: int | None
    busbw_gbps: float | None
    message: str

    @property
    def passed(self) -> bool:
        return self.code is ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "floor_gbps": self.floor_gbps,
            "size_bytes": self.size_bytes,
            "busbw_gbps": self.busbw_gbps,
            "message": self.message,
        }


def check_floor(report: AllReduceReport, floor_gbps: float, *, min_bytes: int | None = None) -> FloorVerdict:
    """Fails when the bus bandwidth at the largest size is under `floor_gbps`; when `min_bytes` is given (the
    size the floor is valid from, see infra/spec/fabric_floors.py), a sweep that stops short of it fails too,
    since small messages are latency-bound and would fail any bandwidth floor."""
    largest = report.largest
    if largest is None:
        return FloorVerdict(
            code=ExitCode.NO_RESULTS,
            floor_gbps=floor_gbps,
            size_bytes=None,
            busbw_gbps=None,
            message=f"FABRIC CHECK FAILED: no all-reduce results to compare with the floor {floor_gbps:g} GB/s",
        )
    size = largest.size_bytes
    busbw = largest.busbw_gbps
    where = f"at {size} B ({human_bytes(size)})"

    def verdict(code: ExitCode, message: str) -> FloorVerdict:
        return FloorVerdict(code=code, floor_gbps=floor_gbps, size_bytes=size, busbw_gbps=busbw, message=message)

    if min_bytes is not None and size < min_bytes:
        return verdict(
            ExitCode.SWEEP_TOO_SHORT,
            f"FABRIC CHECK FAILED: sweep ends {where}, below the {min_bytes} B ({human_bytes(min_bytes)}) "
            f"the floor {floor_gbps:g} GB/s applies from; rerun with a larger max size",
        )
    if busbw is None:
        return verdict(
            ExitCode.BELOW_FLOOR,
            f"FABRIC CHECK FAILED: bus bandwidth N/A {where} below floor {floor_gbps:g} GB/s (not measured)",
        )
    if busbw < floor_gbps:
        return verdict(
            ExitCode.BELOW_FLOOR,
            f"FABRIC CHECK FAILED: bus bandwidth {busbw:.2f} GB/s {where} below floor {floor_gbps:g} GB/s",
        )
    return verdict(
        ExitCode.OK, f"FABRIC CHECK PASSED: bus bandwidth {busbw:.2f} GB/s {where} meets floor {floor_gbps:g} GB/s"
    )


def wrong_results_message(report: AllReduceReport) -> str | None:
    bad = [r.size_bytes for r in report.results if r.wrong]
    if not bad:
        if report.params.get("out_of_bounds"):
            return f"FABRIC CHECK FAILED: nccl-tests reports {report.params['out_of_bounds']} out-of-bounds results"
        return None
    return (
        f"FABRIC CHECK FAILED: {report.wrong_total} wrong elements in all-reduce results "
        f"at sizes {', '.join(str(s) for s in bad)} B"
    )


def exit_code(report: AllReduceReport, verdict: FloorVerdict | None) -> ExitCode:
    """Wrong results outrank everything (data corruption); then no results; then the floor."""
    if report.wrong_total or report.params.get("out_of_bounds"):
        return ExitCode.WRONG_RESULTS
    if not report.results:
        return ExitCode.NO_RESULTS
    return verdict.code if verdict is not None else ExitCode.OK


# --- sizes and the table ------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from "8", "256M", "1G" (binary units, as nccl-tests' -b/-e read them)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use bytes, or a number with K, M or G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def _time_str(time_us: float | None) -> str:
    # nccl-tests: %7.0f from 10 ms, %7.1f from 100 us, %7.2f below.
    if time_us is None:
        return f"{'N/A':>7}"
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    if time_us >= 100.0:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def _bw_str(value: float | None) -> str:
    return f"{'N/A':>6}" if value is None else f"{value:6.2f}"


def _measurement_str(m: Measurement | None) -> str:
    if m is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return f"  {_time_str(m.time_us)}  {_bw_str(m.algbw_gbps)}  {_bw_str(m.busbw_gbps)}  {wrong:>5}"


TABLE_HEADER = (
    f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place",
    f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
    f"{'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}",
    f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  "
    f"{'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}",
)


def format_row(r: SizeResult) -> str:
    return (
        f"{r.size_bytes:12d}  {r.count:12d}  {r.type:>8}  {r.redop:>6}  {r.root:6d}"
        + _measurement_str(r.out_of_place)
        + _measurement_str(r.in_place)
    )


def format_footer(report: AllReduceReport) -> str:
    errors = report.out_of_bounds
    avg = report.avg_busbw_gbps
    return "\n".join(
        [
            f"# Out of bounds values : {errors} {'FAILED' if errors else 'OK'}",
            f"# Avg bus bandwidth    : {'N/A' if avg is None else f'{avg:g}'}",
            "#",
        ]
    )


def format_table(report: AllReduceReport) -> str:
    """The report as nccl-tests prints it (column header, one row per size, out-of-bounds and average lines)."""
    return "\n".join([*TABLE_HEADER, *(format_row(r) for r in report.results), format_footer(report)])


# --- the parser ---------------------------------------------------------------------------------------

# mpirun --tag-output ("[1,0]<stdout>:") and srun --label ("0: ", " 0: ") prefixes.
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<(?:stdout|stderr)>:|\d+:(?=\s|$))\s?")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\s")
_AVG_LINE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_OOB_LINE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_HEADER_PARAMS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)")
_HEADER_ITERS = re.compile(r"warmup iters:\s*(\d+)\s+iters:\s*(\d+)")
_NA = "N/A"


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1).rstrip()


def _number(token: str) -> float | None:
    if token == _NA:
        return None
    if not _FLOAT.match(token):
        raise ValueError(token)
    return float(token)


def _wrong(token: str) -> int | None:
    """#wrong is a count of wrong elements; N/A (or -1 in newer releases) when validation was off (-c 0).
    Old releases printed the largest error instead (e.g. 2e-07), starred when over their threshold: that
    is no count, so it yields None, or 1 when starred."""
    if token.endswith("*"):
        return 1
    if _INT.match(token):
        value = int(token)
        return value if value >= 0 else None
    _number(token)  # N/A or a float; anything else is not a result row
    return None


def _measurement(tokens: Sequence[str]) -> Measurement:
    return Measurement(
        time_us=_number(tokens[0]),
        algbw_gbps=_number(tokens[1]),
        busbw_gbps=_number(tokens[2]),
        wrong=_wrong(tokens[3]),
    )


def parse_row(line: str) -> SizeResult | None:
    """One result row (size count type redop [root] and two groups of time algbw busbw #wrong), or None."""
    tokens = line.split()
    if len(tokens) not in (12, 13) or not (_INT.match(tokens[0]) and _INT.match(tokens[1])):
        return None
    if not (_NAME.match(tokens[2]) and _NAME.match(tokens[3])):
        return None
    has_root = len(tokens) == 13
    if has_root and not _INT.match(tokens[4]):
        return None
    rest = tokens[5:] if has_root else tokens[4:]
    try:
        out_of_place, in_place = _measurement(rest[:4]), _measurement(rest[4:])
    except ValueError:
        return None
    return SizeResult(
        size_bytes=int(tokens[0]),
        count=int(tokens[1]),
        type=tokens[2],
        redop=tokens[3],
        root=int(tokens[4]) if has_root else -1,
        out_of_place=out_of_place,
        in_place=in_place,
    )


def parse_all_reduce_perf(lines: str | Iterable[str], *, source: str = "nccl-tests") -> AllReduceReport:
    """Parse `all_reduce_perf` stdout; raises ValueError when it holds no result rows or several tables."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    results: list[SizeResult] = []
    ranks: set[int] = set()
    avg: float | None = None
    params: dict[str, Any] = {}
    for raw in lines:
        line = strip_prefix(raw)
        if line.lstrip().startswith("#"):
            text = line.lstrip()
            if match := _RANK_LINE.match(text):
                ranks.add(int(match.group(1)))
            elif match := _AVG_LINE.match(text):
                avg = _number(match.group(1))
            elif match := _OOB_LINE.match(text):
                params["out_of_bounds"] = int(match.group(1))
            if match := _HEADER_PARAMS.search(text):
                n_thread, n_gpus, min_bytes, max_bytes = (int(g) for g in match.groups())
                params |= {"nthread": n_thread, "ngpus": n_gpus, "min_bytes": min_bytes, "max_bytes": max_bytes}
            if match := _HEADER_ITERS.search(text):
                params |= {"warmup": int(match.group(1)), "iters": int(match.group(2))}
            continue
        row = parse_row(line)
        if row is None:
            continue
        if results and row.size_bytes <= results[-1].size_bytes:
            raise ValueError(
                f"size {row.size_bytes} B follows {results[-1].size_bytes} B: the log holds more than one "
                "result table (several runs, data types or ops); give one run's output"
            )
        results.append(row)
    if not results:
        raise ValueError("no all_reduce_perf result rows found")
    kinds = {(r.type, r.redop) for r in results}
    if len(kinds) > 1:
        raise ValueError(f"rows mix data types or ops {sorted(kinds)}; give one run's output")
    return AllReduceReport(
        source=source,
        backend="nccl",
        world_size=len(ranks) or None,
        results=tuple(results),
        reported_avg_busbw_gbps=avg,
        params=params,
    )


# --- CLI ----------------------------------------------------------------------------------------------


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text}")
    return value


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_floor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--floor-gbps",
        type=_non_negative_float,
        default=None,
        help=f"fail (exit {int(ExitCode.BELOW_FLOOR)}) when the bus bandwidth at the largest size is under this GB/s",
    )
    parser.add_argument(
        "--floor-min-bytes",
        type=_size_arg,
        default=None,
        help=f"the size the floor applies from; a sweep ending below it fails (exit {int(ExitCode.SWEEP_TOO_SHORT)})",
    )


def evaluate(
    report: AllReduceReport, floor_gbps: float | None, floor_min_bytes: int | None
) -> tuple[ExitCode, FloorVerdict | None, list[str]]:
    """The exit code, the floor verdict, and the FABRIC CHECK lines to log."""
    verdict = check_floor(report, floor_gbps, min_bytes=floor_min_bytes) if floor_gbps is not None else None
    messages = [m for m in (wrong_results_message(report), verdict.message if verdict else None) if m]
    return exit_code(report, verdict), verdict, messages


def result_json(report: AllReduceReport, verdict: FloorVerdict | None, code: ExitCode) -> dict[str, Any]:
    return report.to_json() | {"floor": verdict.to_json() if verdict else None, "exit_code": int(code)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.nccl_tests",
        description="Summarize nccl-tests all_reduce_perf output and check it against a bus-bandwidth floor.",
    )
    parser.add_argument("file", help="all_reduce_perf output (a log file, or - for stdin)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    add_floor_arguments(parser)
    args = parser.parse_args(argv)

    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8", errors="replace")
    try:
        report = parse_all_reduce_perf(text)
    except ValueError as err:
        print(f"FABRIC CHECK FAILED: {args.file}: {err}", file=sys.stderr)
        return int(ExitCode.NO_RESULTS)
    code, verdict, messages = evaluate(report, args.floor_gbps, args.floor_min_bytes)
    if args.json:
        print(json.dumps(result_json(report, verdict, code), indent=2))
    else:
        print(format_table(report))
    for message in messages:
        print(message, file=sys.stderr if args.json else sys.stdout)
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())

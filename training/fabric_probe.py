"""All-reduce bandwidth probe: the nccl-tests `all_reduce_perf` sweep, in PyTorch distributed.

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK --master-addr $HEAD --master-port 29500 \\
        -m training.fabric_probe --max-bytes 2G --floor-gbps 350.2 --output-json /tmp/fabric/efa.json

Every rank reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (torchrun sets them). On GPUs
the collective is NCCL on `cuda:LOCAL_RANK`; without GPUs it is gloo on the CPU (tests, laptops).

For each size of the sweep (min to max bytes, multiplied by --factor): --warmup untimed all-reduces, a
barrier, --iters timed all-reduces (with a CUDA synchronize before the clock stops), the time per
iteration averaged over ranks as nccl-tests does; then one all-reduce of known per-rank values whose
result every rank checks element by element (#wrong, summed over ranks). torch's all_reduce works in place,
so the report fills nccl-tests' in-place columns and prints N/A for out-of-place.

Rank 0 prints the nccl-tests table, the FABRIC CHECK line(s) and writes --output-json (the report format
of training/nccl_tests.py). Exit codes: training.nccl_tests.ExitCode (wrong results 4, floor 3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from training.nccl_tests import (
    TABLE_HEADER,
    AllReduceReport,
    Measurement,
    SizeResult,
    add_floor_arguments,
    evaluate,
    format_footer,
    format_row,
    human_bytes,
    parse_size,
    result_json,
)
from training.rehearsal import cpu_rehearsal

# (torch dtype, the nccl-tests type name printed in the "type" column)
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "float"),
    "bfloat16": (torch.bfloat16, "bfloat16"),
}
# Known values: rank r puts 2 where (i + r) % PERIOD == 0 and 1 elsewhere, so a sum misses or duplicates a
# rank's contribution, or shifts a chunk by other than a multiple of PERIOD, only by changing some element.
# A prime period never divides the power-of-two chunk sizes collectives cut buffers into.
PATTERN_PERIOD = 7


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int


def read_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """The torchrun contract; MASTER_ADDR and MASTER_PORT are read by init_process_group itself."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in environ]
    if missing:
        raise SystemExit(f"fabric_probe: {', '.join(missing)} not set; launch with torchrun")
    env = DistEnv(
        rank=int(environ["RANK"]), world_size=int(environ["WORLD_SIZE"]), local_rank=int(environ["LOCAL_RANK"])
    )
    if not 0 <= env.rank < env.world_size:
        raise SystemExit(f"fabric_probe: RANK={env.rank} is outside WORLD_SIZE={env.world_size}")
    return env


@dataclass(frozen=True)
class DevicePlan:
    backend: str
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def plan_device(local_rank: int, requested: str = "auto") -> DevicePlan:
    """The only place that picks backend and device: NCCL on cuda:LOCAL_RANK, else gloo on the CPU
    (always gloo in a CPU rehearsal, training/rehearsal.py)."""
    if cpu_rehearsal():
        requested = "cpu"
    use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise SystemExit("fabric_probe: --device cuda but CUDA is not available")
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"fabric_probe: LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs")
        return DevicePlan(backend="nccl", device=torch.device("cuda", local_rank))
    return DevicePlan(backend="gloo", device=torch.device("cpu"))


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int, element_size: int) -> list[int]:
    """min, min*factor, ... up to max, each rounded down to whole elements (as nccl-tests does)."""
    if factor < 2:
        raise ValueError(f"factor must be at least 2, got {factor}")
    if min_bytes < element_size:
        raise ValueError(f"min bytes {min_bytes} is less than one {element_size}-byte element")
    if max_bytes < min_bytes:
        raise ValueError(f"max bytes {max_bytes} is less than min bytes {min_bytes}")
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size // element_size * element_size)
        size *= factor
    return sizes


def rank_pattern(rank: int, period: int = PATTERN_PERIOD) -> list[float]:
    return [2.0 if (i + rank) % period == 0 else 1.0 for i in range(period)]


def expected_pattern(world_size: int, period: int = PATTERN_PERIOD) -> list[float]:
    return [sum(rank_pattern(r, period)[i] for r in range(world_size)) for i in range(period)]


def fill_periodic(view: torch.Tensor, row: torch.Tensor) -> None:
    """view[i] = row[i % len(row)], without a temporary the size of view."""
    period = row.numel()
    whole = view.numel() // period * period
    if whole:
        view[:whole].view(-1, period).copy_(row.expand(whole // period, period))
    view[whole:].copy_(row[: view.numel() - whole])


def _mismatches(values: torch.Tensor, expected: torch.Tensor, tolerance: float) -> int:
    if tolerance == 0.0:  # exact: compare in the buffer's dtype, with no full-size float temporaries
        return int((values != expected.to(values.dtype)).sum().item())
    return int(((values.float() - expected.float()).abs() > tolerance).sum().item())


def count_wrong(view: torch.Tensor, expected_row: torch.Tensor, tolerance: float) -> int:
    """Elements of view that differ from the periodic expectation by more than tolerance."""
    period = expected_row.numel()
    whole = view.numel() // period * period
    wrong = _mismatches(view[:whole].view(-1, period), expected_row, tolerance) if whole else 0
    return wrong + _mismatches(view[whole:], expected_row[: view.numel() - whole], tolerance)


def check_tolerance(dtype: torch.dtype, world_size: int) -> float:
    """0 while every partial sum (at most 2 * world size) is an exactly representable integer (bf16: up to
    256, float32: up to 2**24); beyond that, the rounding a sum of world-size terms can accumulate."""
    eps = torch.finfo(dtype).eps
    largest = 2.0 * world_size
    if largest <= 2.0 / eps:
        return 0.0
    return largest * world_size * eps


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    sizes: tuple[int, ...]
    dtype_name: str
    iters: int
    warmup: int

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name][0]

    @property
    def type_label(self) -> str:
        return DTYPES[self.dtype_name][1]


def _sync(plan: DevicePlan) -> None:
    if plan.is_cuda:
        torch.cuda.synchronize(plan.device)


def _barrier(plan: DevicePlan) -> None:
    _sync(plan)
    dist.barrier()


def _average_over_ranks(value: float, plan: DevicePlan, world_size: int) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=plan.device)
    dist.all_reduce(t)
    return float(t.item()) / world_size


def _sum_over_ranks(value: int, plan: DevicePlan) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=plan.device)
    dist.all_reduce(t)
    return int(t.item())


def time_all_reduce(buf: torch.Tensor, plan: DevicePlan, *, iters: int, warmup: int) -> float:
    """Seconds per all-reduce of buf on this rank (between a barrier and the last op's completion)."""
    for _ in range(warmup):
        dist.all_reduce(buf)
    _barrier(plan)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(plan)
    return (time.perf_counter() - start) / iters


def check_all_reduce(buf: torch.Tensor, plan: DevicePlan, env: DistEnv) -> int:
    """Wrong elements, over all ranks, of one all-reduce of the known per-rank values."""
    row = torch.tensor(rank_pattern(env.rank), dtype=buf.dtype, device=plan.device)
    expected = torch.tensor(expected_pattern(env.world_size), dtype=torch.float32, device=plan.device)
    fill_periodic(buf, row)
    dist.all_reduce(buf)
    _sync(plan)
    return _sum_over_ranks(count_wrong(buf, expected, check_tolerance(buf.dtype, env.world_size)), plan)


def run_sweep(
    config: ProbeConfig, plan: DevicePlan, env: DistEnv, on_result: Callable[[SizeResult], None] | None = None
) -> AllReduceReport:
    element_size = torch.empty((), dtype=config.dtype).element_size()
    storage = torch.zeros(max(config.sizes) // element_size, dtype=config.dtype, device=plan.device)
    results: list[SizeResult] = []
    for size in config.sizes:
        count = size // element_size
        buf = storage[:count]
        # Zeros stay zeros however often they are summed: no overflow, no denormals, in the timed loop.
        buf.zero_()
        seconds = time_all_reduce(buf, plan, iters=config.iters, warmup=config.warmup)
        seconds = _average_over_ranks(seconds, plan, env.world_size)
        wrong = check_all_reduce(buf, plan, env)
        in_place = Measurement.from_time(size_bytes=size, seconds=seconds, world_size=env.world_size, wrong=wrong)
        result = SizeResult(size_bytes=size, count=count, type=config.type_label, redop="sum", in_place=in_place)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return AllReduceReport(
        source="fabric_probe",
        backend=plan.backend,
        world_size=env.world_size,
        results=tuple(results),
        params={
            "device": plan.device.type,
            "dtype": config.dtype_name,
            "min_bytes": config.sizes[0],
            "max_bytes": config.sizes[-1],
            "iters": config.iters,
            "warmup": config.warmup,
        },
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.fabric_probe",
        description="All-reduce bus-bandwidth sweep (nccl-tests all_reduce_perf, in PyTorch). Launch with torchrun.",
    )
    parser.add_argument("--min-bytes", type=_size, default=8, help="smallest message (bytes, or K/M/G); default 8")
    parser.add_argument("--max-bytes", type=_size, default=1 << 30, help="largest message; default 1G")
    parser.add_argument("--factor", type=int, default=2, help="size multiplier between steps; default 2")
    parser.add_argument("--iters", type=_positive_int, default=20, help="timed iterations per size; default 20")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations per size; default 5")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda if available")
    parser.add_argument("--timeout-s", type=_positive_int, default=600, help="collective timeout; default 600")
    parser.add_argument("--output-json", type=Path, default=None, help="rank 0 writes the report here")
    add_floor_arguments(parser)
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    try:
        element_size = torch.empty((), dtype=DTYPES[args.dtype][0]).element_size()
        args.sizes = tuple(sweep_sizes(args.min_bytes, args.max_bytes, args.factor, element_size))
    except ValueError as err:
        parser.error(str(err))
    if args.floor_min_bytes is not None and args.sizes[-1] < args.floor_min_bytes:
        parser.error(
            f"the sweep ends at {args.sizes[-1]} B, below --floor-min-bytes {args.floor_min_bytes} B; raise --max-bytes"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = read_dist_env(os.environ)
    plan = plan_device(env.local_rank, args.device)
    config = ProbeConfig(sizes=args.sizes, dtype_name=args.dtype, iters=args.iters, warmup=args.warmup)
    if plan.is_cuda:
        torch.cuda.set_device(plan.device)
    dist.init_process_group(
        backend=plan.backend,
        timeout=timedelta(seconds=args.timeout_s),
        device_id=plan.device if plan.is_cuda else None,
    )
    try:
        if env.rank == 0:
            print(
                f"# fabric_probe: all_reduce sum, backend {plan.backend}, world size {env.world_size}, "
                f"device {plan.device.type}, dtype {args.dtype}\n"
                f"# minBytes {config.sizes[0]} maxBytes {config.sizes[-1]} ({human_bytes(config.sizes[-1])}) "
                f"step: {args.factor}(factor) warmup iters: {config.warmup} iters: {config.iters}\n#",
            )
            print("\n".join(TABLE_HEADER), flush=True)

        def print_row(result: SizeResult) -> None:
            if env.rank == 0:
                print(format_row(result), flush=True)

        report = run_sweep(config, plan, env, on_result=print_row)
        # Every rank holds the same averaged times and summed counts, so every rank exits with the same code.
        code, verdict, messages = evaluate(report, args.floor_gbps, args.floor_min_bytes)
        if env.rank == 0:
            print(format_footer(report))
            for message in messages:
                print(message)
            if args.output_json is not None:
                args.output_json.parent.mkdir(parents=True, exist_ok=True)
                args.output_json.write_text(json.dumps(result_json(report, verdict, code), indent=2) + "\n")
            sys.stdout.flush()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())

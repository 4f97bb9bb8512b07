"""The NVRx job's configuration: its command line (`python -m training.nvrx_fsdp ...`), the Job it parses
into, and NVRx's rule for the in-process restart timeouts (soft < hard < barrier, all longer than the
Wrapper's monitoring interval), defined here once for the training CLI and for the chart that writes its
flags (k8s/nvrx_spec.py). Standard library only: the chart test and `--check-args` parse flags without
torch, and it ships to the pods in the training-code ConfigMap (k8s/charts/ray.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from training import deadline, fabric_gate_config
from training.faults import FaultKind, FaultSpec, check_fault, default_marker, parse_fault
from training.journal import JOURNAL_FILE
from training.rehearsal import cpu_rehearsal

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"
# The first line of training/nvrx_fsdp.py's docstring: the parser's description.
DESCRIPTION = "Fault-tolerant FSDP2 causal-LM training under NVIDIA Resiliency Extension (NVRx) 0.7.0."
# NVRx's Wrapper monitors (threads, monitor process, progress watchdog) every second by default; its timeouts must
# be longer than that.
NVRX_MONITOR_INTERVAL_S = 1.0

DeviceChoice = Literal["auto", "cpu", "cuda"]
CkptMode = Literal["async", "sync"]
SaverChoice = Literal["auto", "torch", "nvrx"]
# NVRx 0.7.0's async checkpoint finalize broadcasts its failure flag in a tensor on torch.cuda.current_device()
# (checkpointing/async_ckpt/state_dict_saver.py save_state_dict_async_finalize; 0.4.1 ran on CPU).
NVRX_SAVER_NEEDS_CUDA = (
    "--ckpt-saver nvrx needs --device cuda: NVRx 0.7.0 finalizes its async checkpoints with a CUDA tensor; "
    "use --ckpt-saver torch or auto on CPU"
)


# --- NVRx's in-process timeout rule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeoutNames:
    """How a caller names the three timeouts in its messages: flags (`--inprocess-soft-timeout 60`) or fields."""

    soft: str
    hard: str
    barrier: str
    separator: str = " "


FLAGS = TimeoutNames("--inprocess-soft-timeout", "--inprocess-hard-timeout", "--inprocess-barrier-timeout")


def inprocess_timeout_problem(soft: float, hard: float, barrier: float, names: TimeoutNames = FLAGS) -> str | None:
    """What NVRx 0.7.0's inprocess.Wrapper would refuse in these timeouts (seconds), or None: each must be a
    positive finite number, soft longer than the monitoring interval, and soft < hard < barrier."""
    sep = names.separator
    for name, value in ((names.soft, soft), (names.hard, hard), (names.barrier, barrier)):
        if not (math.isfinite(value) and value > 0):
            return f"{name}{sep}{value:g} must be a positive number of seconds"
    if soft <= NVRX_MONITOR_INTERVAL_S:
        return (
            f"{names.soft}{sep}{soft:g} must be longer than NVRx's {NVRX_MONITOR_INTERVAL_S:g} s "
            f"monitoring interval; use e.g. {names.soft}{sep}60"
        )
    if not soft < hard:
        return (
            f"{names.soft}{sep}{soft:g} must be less than {names.hard}{sep}{hard:g} (NVRx needs "
            f"soft < hard < barrier); raise {names.hard} above {soft:g} or lower the soft timeout"
        )
    if not hard < barrier:
        return (
            f"{names.hard}{sep}{hard:g} must be less than {names.barrier}{sep}{barrier:g} (NVRx "
            f"needs soft < hard < barrier); raise {names.barrier} above {hard:g} or lower the hard one"
        )
    return None


# --- the job -----------------------------------------------------------------------------------------------------


def _finite_positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} {value:g} must be a positive number of seconds")


@dataclass(frozen=True)
class InprocessConfig:
    """NVRx inprocess.Wrapper settings; NVRx refuses timeouts unless soft < hard < barrier."""

    enabled: bool = False
    soft_timeout_s: float = 60.0
    hard_timeout_s: float = 90.0
    barrier_timeout_s: float = 120.0
    max_iterations: int = 10

    def __post_init__(self) -> None:
        problem = inprocess_timeout_problem(self.soft_timeout_s, self.hard_timeout_s, self.barrier_timeout_s)
        if problem is not None:
            raise ValueError(problem)
        if self.max_iterations < 1:
            raise ValueError(
                f"--inprocess-max-iterations {self.max_iterations} must be at least 1 (the first run counts)"
            )

    @property
    def heartbeat_timeout_s(self) -> float:
        # The Wrapper's missing-rank timeout: NVRx needs interval < heartbeat timeout < barrier timeout.
        return min(30.0, (NVRX_MONITOR_INTERVAL_S + self.barrier_timeout_s) / 2)


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("--store-addr needs a host, e.g. --store-addr trainer-0.trainer:29501")
        if not 1 <= self.port <= 65534:
            raise ValueError(
                f"--store-addr port {self.port} is out of range: NVRx's Wrapper store takes PORT+1, so use 1..65534"
            )

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_store_addr(text: str) -> StoreAddress:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"--store-addr {text!r} is not HOST:PORT; use e.g. --store-addr trainer-0.trainer:29501")
    return StoreAddress(host=host.removeprefix("[").removesuffix("]"), port=int(port))


def default_store_addr() -> StoreAddress:
    """$MASTER_ADDR:$MASTER_PORT+1: torchrun/ft_launcher's own store listens on MASTER_PORT. ft_launcher sets
    MASTER_ADDR=localhost, so multi-node jobs must pass --store-addr with rank 0's real host."""
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise ValueError(
            "--inprocess without --store-addr needs MASTER_ADDR and MASTER_PORT (set by the launcher)"
        ) from None
    return StoreAddress(host=host, port=port + 1)


@dataclass(frozen=True)
class Job:
    model: str
    ckpt_dir: Path
    data: Path | None = None
    seq_len: int = 512
    batch_size: int = 4
    steps: int = 100
    lr: float = 1e-5
    seed: int = 0
    device: DeviceChoice = "auto"
    ckpt_every: int = 50
    ckpt_mode: CkptMode = "async"
    ckpt_keep: int = 2
    ckpt_saver: SaverChoice = "auto"
    ckpt_slow_write_s: float = 0.0
    # Rehearsals on a tiny model (rehearse/scale.py): a step there takes ~50 ms, less than the rehearsal's tick, so
    # a fault meant to land after one checkpoint would land after the next; each step lasts at least this long.
    min_step_s: float = 0.0
    inprocess: InprocessConfig = field(default_factory=InprocessConfig)
    store_addr: StoreAddress | None = None
    fault: FaultSpec | None = None
    fault_marker: Path | None = None
    metrics_file: Path | None = None
    pg_timeout_s: float | None = None
    log_every: int = 1
    gate: fabric_gate_config.GateConfig = field(default_factory=fabric_gate_config.GateConfig)

    def __post_init__(self) -> None:
        for flag, value in (
            ("--seq-len", self.seq_len),
            ("--batch-size", self.batch_size),
            ("--steps", self.steps),
            ("--ckpt-every", self.ckpt_every),
            ("--ckpt-keep", self.ckpt_keep),
            ("--log-every", self.log_every),
        ):
            if value < 1:
                raise ValueError(f"{flag} {value} must be at least 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr {self.lr:g} must be a positive number")
        if not (math.isfinite(self.ckpt_slow_write_s) and self.ckpt_slow_write_s >= 0):
            raise ValueError(f"--ckpt-slow-write-s {self.ckpt_slow_write_s:g} must be 0 or more seconds")
        if not (math.isfinite(self.min_step_s) and self.min_step_s >= 0):
            raise ValueError(f"--min-step-s {self.min_step_s:g} must be 0 or more seconds")
        if self.ckpt_slow_write_s > 0 and self.ckpt_saver == "nvrx":
            raise ValueError("--ckpt-slow-write-s works with the torch savers only; drop it or use --ckpt-saver torch")
        if self.ckpt_saver == "nvrx" and self.device == "cpu":
            raise ValueError(NVRX_SAVER_NEEDS_CUDA)
        if self.pg_timeout_s is not None:
            _finite_positive("--pg-timeout", self.pg_timeout_s)
        if self.fault is not None:
            check_fault(self.fault, steps=self.steps, ckpt_every=self.ckpt_every, ckpt_mode=self.ckpt_mode)

    @property
    def marker(self) -> Path | None:
        if self.fault is None:
            return None
        return self.fault_marker or default_marker(self.ckpt_dir, self.fault)

    @property
    def journal(self) -> Path:
        return self.ckpt_dir / JOURNAL_FILE

    def is_checkpoint_step(self, step: int) -> bool:
        return step % self.ckpt_every == 0 or step == self.steps


# --- command line ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.nvrx_fsdp",
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--model", default=DEFAULT_MODEL, help="Hugging Face model id or local directory")
    add("--data", type=Path, default=None, help="local .txt/.jsonl file to train on (default: synthetic tokens)")
    add("--seq-len", type=int, default=512, help="tokens per sequence")
    add("--batch-size", type=int, default=4, help="sequences per rank per step")
    add("--steps", type=int, default=100, help="target global step count")
    add("--lr", type=float, default=1e-5, help="AdamW learning rate")
    add("--seed", type=int, default=0, help="seeds model-independent RNGs and the data order")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto", help="cuda + NCCL or cpu + gloo")
    add("--log-every", type=int, default=1, help="print the loss every N steps")

    group = parser.add_argument_group("checkpoints")
    group.add_argument("--ckpt-dir", type=Path, required=True, help="checkpoints, journal and fault markers")
    group.add_argument("--ckpt-every", type=int, default=50, help="save every N steps (and at the last step)")
    group.add_argument("--ckpt-mode", choices=["async", "sync"], default="async", help="async: save in the background")
    group.add_argument("--ckpt-keep", type=int, default=2, help="committed checkpoints to keep")
    group.add_argument(
        "--ckpt-saver",
        choices=["auto", "torch", "nvrx"],
        default="auto",
        help="async saver: NVRx async_ckpt (auto on CUDA) or torch.distributed.checkpoint.async_save (auto on CPU)",
    )
    group.add_argument("--ckpt-slow-write-s", type=float, default=0.0, help=argparse.SUPPRESS)
    add("--min-step-s", type=float, default=0.0, help=argparse.SUPPRESS)

    group = parser.add_argument_group("in-process restart (NVRx inprocess.Wrapper)")
    group.add_argument("--inprocess", action="store_true", help="restart the training function in-process on faults")
    group.add_argument("--inprocess-soft-timeout", type=float, default=60.0, help="seconds without progress: abort")
    group.add_argument("--inprocess-hard-timeout", type=float, default=90.0, help="seconds without progress: kill")
    group.add_argument("--inprocess-barrier-timeout", type=float, default=120.0, help="restart barrier timeout")
    group.add_argument(
        "--inprocess-max-iterations", type=int, default=10, help="runs of the training function, the first included"
    )
    group.add_argument(
        "--store-addr",
        default=None,
        help="HOST:PORT of the TCPStore behind each iteration's process group (the Wrapper's own store takes "
        "PORT+1); default $MASTER_ADDR:$MASTER_PORT+1",
    )
    group.add_argument(
        "--pg-timeout", type=float, default=None, help="collective timeout in seconds (default: derived)"
    )

    group = parser.add_argument_group("fault injection (tests, benchmarks)")
    group.add_argument("--fault", default=None, help=" | ".join(FaultKind))
    group.add_argument("--fault-step", type=int, default=None, help="step (from 1) at whose start the fault fires")
    group.add_argument("--fault-rank", type=int, default=None, help="rank that fails (default 0)")
    group.add_argument("--fault-marker", type=Path, default=None, help="fire-once marker (default: in --ckpt-dir)")

    fabric_gate_config.add_gate_arguments(parser)

    group = parser.add_argument_group("output")
    group.add_argument("--metrics-file", type=Path, default=None, help="JSON metrics, written by rank 0 at the end")
    parser.add_argument(
        "--check-args",
        action="store_true",
        help="parse and validate the arguments and the device, then exit: 0 valid, 2 not. Run before ft_launcher, "
        "which turns any worker failure into its own exit 1 (so a Job's exit-2 rule would never see it)",
    )
    return parser


def job_from_args(args: argparse.Namespace) -> Job:
    inprocess = InprocessConfig(
        enabled=args.inprocess,
        soft_timeout_s=args.inprocess_soft_timeout,
        hard_timeout_s=args.inprocess_hard_timeout,
        barrier_timeout_s=args.inprocess_barrier_timeout,
        max_iterations=args.inprocess_max_iterations,
    )
    model = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
    return Job(
        model=model,
        ckpt_dir=args.ckpt_dir.resolve(),
        data=args.data.resolve() if args.data is not None else None,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        ckpt_every=args.ckpt_every,
        ckpt_mode=args.ckpt_mode,
        ckpt_keep=args.ckpt_keep,
        ckpt_saver=args.ckpt_saver,
        ckpt_slow_write_s=args.ckpt_slow_write_s,
        min_step_s=args.min_step_s,
        inprocess=inprocess,
        store_addr=parse_store_addr(args.store_addr) if args.store_addr is not None else None,
        fault=parse_fault(args.fault, args.fault_step, args.fault_rank),
        fault_marker=args.fault_marker.resolve() if args.fault_marker is not None else None,
        metrics_file=args.metrics_file.resolve() if args.metrics_file is not None else None,
        pg_timeout_s=args.pg_timeout,
        log_every=args.log_every,
        gate=fabric_gate_config.gate_config(args),
    )


def parse_command(argv: Sequence[str] | None = None) -> tuple[Job, bool]:
    """(the job of a command line, whether only --check-args was asked); errors exit 2 naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        deadline.from_env()  # a Capacity Block's variables (k8s/capacity_deadline.py), checked with the flags
        return job_from_args(args), bool(args.check_args)
    except ValueError as exc:
        parser.error(str(exc))


def parse_job(argv: Sequence[str] | None = None) -> Job:
    """The job of a command line; errors exit with status 2 and a message naming the flag."""
    return parse_command(argv)[0]


EXIT_BAD_ARGUMENTS = 2


# --check-args answered before torch is imported where torch has nothing to say. Each NVRx pod checks its command
# line first (k8s/charts/nvrx_job.py), then ft_launcher starts the ranks, each of which imports torch and
# transformers. The check needs torch only to ask CUDA whether a device is visible (--device cuda or auto); on CPU
# (--device cpu, or a CPU rehearsal, training/rehearsal.py) it would import both for nothing, once more per pod.


def arguments_ok(job: Job, device_type: str, backend: str) -> str:
    return f"arguments ok: {job.steps} steps on {device_type} ({backend}), checkpoints in {job.ckpt_dir}"


def exit_if_check_only_on_cpu(argv: Sequence[str] | None = None) -> None:
    """Exits 0 (or 2 on a bad argument) for a --check-args run whose device is CPU; returns otherwise."""
    if "--check-args" not in (sys.argv[1:] if argv is None else argv):
        return
    job, check_only = parse_command(argv)  # a bad argument exits 2 here, naming it
    if check_only and (cpu_rehearsal() or job.device == "cpu"):
        print(arguments_ok(job, "cpu", "gloo"), flush=True)
        raise SystemExit(0)

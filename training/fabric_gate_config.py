"""The fabric gate's settings and flags (training/fabric_gate.py runs it): standard library only, so the training CLIs
(training/nvrx_config.py) parse and validate them without torch, as the pods' `--check-args` does."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Floor:
    busbw_gbps: float
    message_bytes: int
    instance_type: str = ""

    def __str__(self) -> str:
        where = f" ({self.instance_type})" if self.instance_type else ""
        return f"{self.busbw_gbps:g} GB/s{where} from {human_bytes(self.message_bytes)}"


def human_bytes(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    enabled: bool = False
    floor: Floor | None = None
    budget_s: float = 60.0
    max_failures: int = 2
    state_dir: Path | None = None
    """Shared by every pod of the job (the checkpoint claim): the gate failures of each run are counted there."""
    workload: str | None = None
    """KIND/NAME of the workload the Events name (Job/nvrx-fsdp, RayJob/ray-finetune)."""
    efa_devices: int | None = None
    run_seconds: float | None = None
    run_id: str | None = None
    """Names the run's shared verdict file, and counts failures when the controller's answer carries no workload uid
    (default: FABRIC_GATE_RUN_ID, the Job's uid, 'default')."""

    def __post_init__(self) -> None:
        if self.enabled and self.floor is None:
            raise ValueError("--fabric-gate needs --fabric-gate-floor-gbps and --fabric-gate-message-bytes")
        if not 1 <= self.budget_s <= 3600:
            raise ValueError(f"--fabric-gate-budget-s {self.budget_s:g} must be 1 to 3600 seconds")
        if self.max_failures < 1:
            raise ValueError(f"--fabric-gate-max-failures {self.max_failures} must be at least 1")
        if self.workload is not None and self.workload.count("/") != 1:
            raise ValueError(f"--fabric-gate-workload {self.workload!r} must be KIND/NAME, e.g. Job/nvrx-fsdp")


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fabric gate (training/fabric_gate.py)")
    add = group.add_argument
    add("--fabric-gate", action="store_true", help="prove the gang's EFA before step 1; take a failing node out")
    add("--fabric-gate-floor-gbps", type=float, default=None, help="all-reduce bus-bandwidth floor, GB/s")
    add("--fabric-gate-message-bytes", type=int, default=None, help="the message size the floor applies from")
    add("--fabric-gate-instance-type", default="", help="named in the verdict and the EMF line")
    add("--fabric-gate-budget-s", type=float, default=60.0, help="time budget of the sweep and the pair tests")
    add("--fabric-gate-max-failures", type=int, default=2, help="gate failures of one run before the job fails")
    add("--fabric-gate-state-dir", type=Path, default=None, help="shared directory counting gate failures")
    add("--fabric-gate-workload", default=None, help="KIND/NAME of the workload, for its Event")
    add("--fabric-gate-efa-devices", type=int, default=None, help="EFA devices each node should show")
    add("--fabric-gate-run-seconds", type=float, default=None, help="the configured run, for the cost's share")
    add(
        "--fabric-gate-run-id",
        default=None,
        help="names the run's verdict file; failures count against the workload uid the controller answers with "
        "(default: the Job's uid)",
    )


def gate_config(args: argparse.Namespace) -> GateConfig:
    floor = None
    if args.fabric_gate_floor_gbps is not None or args.fabric_gate_message_bytes is not None:
        if args.fabric_gate_floor_gbps is None or args.fabric_gate_message_bytes is None:
            raise ValueError("--fabric-gate-floor-gbps and --fabric-gate-message-bytes go together")
        if args.fabric_gate_floor_gbps <= 0 or args.fabric_gate_message_bytes < 4:
            raise ValueError("--fabric-gate-floor-gbps must be > 0 and --fabric-gate-message-bytes at least 4")
        floor = Floor(args.fabric_gate_floor_gbps, args.fabric_gate_message_bytes, args.fabric_gate_instance_type)
    return GateConfig(
        enabled=args.fabric_gate,
        floor=floor,
        budget_s=args.fabric_gate_budget_s,
        max_failures=args.fabric_gate_max_failures,
        state_dir=args.fabric_gate_state_dir,
        workload=args.fabric_gate_workload,
        efa_devices=args.fabric_gate_efa_devices,
        run_seconds=args.fabric_gate_run_seconds,
        run_id=args.fabric_gate_run_id,
    )

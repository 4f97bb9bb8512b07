"""One rank of a gated job on gloo, for tests: `python -m tests.fabric_gate.gate_worker RANK WORLD PORT STATE_DIR`.
Prints the verdict as one JSON line and exits with the gate's code (0 when it passed or did not run)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from training.fabric_gate import Floor, GateConfig, GateFailedError, run_gate


def main() -> int:
    rank, world, port, state = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    config = GateConfig(
        enabled=True,
        floor=Floor(350.2, 2 << 30, "p5.48xlarge"),
        budget_s=30,
        max_failures=2,
        state_dir=state,
        workload="Job/gated",
        efa_devices=32,
        run_seconds=3600,
    )
    try:
        verdict = run_gate(config, backend="gloo")
        code = 0
    except GateFailedError as failed:
        verdict, code = failed.verdict, failed.exit_code
    print("VERDICT " + json.dumps(verdict.to_json()), flush=True)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())

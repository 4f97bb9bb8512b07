"""One rank of a gated job on gloo, for tests: `python -m tests.fabric_gate.gate_worker RANK WORLD STATE_DIR`.
Prints the verdict as one JSON line and exits with the gate's code (0 when it passed or did not run)."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from training.fabric_gate import Floor, GateConfig, GateFailedError, run_gate


def rendezvous(rank: int, world: int, state: Path, timeout: timedelta) -> TCPStore:
    """Rank 0's store on a port the kernel picks, published in STATE_DIR/store-port for the other ranks. A port
    chosen free by the test and bound later by rank 0 could be taken in between by a process of a parallel test:
    rank 0 then failed and the others met a stranger (gloo "Connection closed by peer", seen in make test)."""
    published = state / "store-port"
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
        partial = published.with_suffix(".partial")
        partial.write_text(str(store.port))
        partial.replace(published)
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while not published.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 published no store port in {published} within {timeout}")
        time.sleep(0.05)
    return TCPStore("127.0.0.1", int(published.read_text()), world, is_master=False, timeout=timeout)


def main() -> int:
    rank, world, state = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    timeout = timedelta(seconds=60)
    store = rendezvous(rank, world, state, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
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
    # As the training collectives that follow the gate in a job: no rank leaves while a peer is still connecting (a
    # NOT RUN verdict needs no collective, and rank 0 leaving first broke rank 1's gloo mesh in a fresh clone's run).
    dist.barrier()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())

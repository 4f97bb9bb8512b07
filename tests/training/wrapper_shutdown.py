"""One rank of a 3-rank in-process run whose training function does nothing, with NVRx 0.7.0's Wrapper shutdown
slowed where it races: `python -m tests.training.wrapper_shutdown RANK WORLD_SIZE STORE_PORT CKPT_DIR`.

In the Wrapper's termination barrier (inprocess/store.py reentrant_barrier) each rank appends itself to the
arrivals, then reads them back, and the rank that completes them sets the key that rank 0 (the critical rank,
which waits) is waiting for. Here ranks 0 and 1 arrive first, rank 2 completes the barrier and releases rank 0,
and only then does rank 1 read the arrivals back: from a store that must still be there."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

# Long enough for rank 0 to return from its Wrapper on a loaded machine (it shuts two threads down).
RANK_0_EXIT_S = 5.0


def main() -> int:
    rank, world_size, port, ckpt_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port - 1),
    )
    print(f"rank {rank} started at {time.monotonic():.1f}", flush=True)
    from nvidia_resiliency_ext.inprocess.store import StoreMixin

    import training.nvrx_fsdp as nvrx
    from training.nvrx_config import parse_job

    barrier = f"{StoreMixin.BARRIER_PREFIX}:reentrant_barrier:{StoreMixin.TERMINATION_BARRIER}"
    arrivals, completed = f"{barrier}:arrived", f"{barrier}:last_worker_arrived"
    if rank == 1:
        get_packed = StoreMixin.get_packed

        def slow_read(self: Any, key: str, sep: str) -> Any:
            # Rank 1 has arrived; it reads the arrivals back only once rank 2 has completed the barrier (releasing
            # rank 0) and rank 0 has had RANK_0_EXIT_S to return from its Wrapper.
            if key == arrivals:
                while not self.check([completed]):
                    time.sleep(0.05)
                time.sleep(RANK_0_EXIT_S)
            return get_packed(self, key, sep)

        StoreMixin.get_packed = slow_read
    if rank == 2:

        def late_arrival(self: Any, **kwargs: Any) -> None:
            # Rank 2 arrives last: after ranks 0 and 1.
            while not self.check([arrivals]) or self.get(arrivals).decode().count(",") < 2:
                time.sleep(0.05)
            StoreMixin.reentrant_barrier(self, group_name=StoreMixin.TERMINATION_BARRIER, **kwargs)

        StoreMixin.termination_barrier = late_arrival

    def train_once(*_args: Any, **_kwargs: Any) -> None:
        print(f"rank {rank} trained at {time.monotonic():.1f}", flush=True)

    nvrx.train_once = train_once
    job = parse_job(
        [
            *("--ckpt-dir", ckpt_dir, "--device", "cpu", "--inprocess", "--store-addr", f"127.0.0.1:{port}"),
            *("--inprocess-soft-timeout", "10", "--inprocess-hard-timeout", "15", "--inprocess-barrier-timeout", "20"),
        ]
    )
    nvrx.run_inprocess(job, nvrx.plan_device("cpu"))
    print(f"rank {rank} left its Wrapper at {time.monotonic():.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

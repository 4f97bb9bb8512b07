"""The one switch between a real run and a CPU rehearsal (`trainctl rehearse`).

`trainctl rehearse` sets PLATFORM_REHEARSAL=cpu in every pod it runs; nothing else does. The
training code reads it where it picks its device: with it, a job whose manifest asks for CUDA and
NCCL (`--device=cuda`, `--use-gpu`) runs on the CPU with gloo instead of refusing to start, so the
manifest itself can be rehearsed unchanged on a machine without GPUs. Without it, nothing changes.
"""

from __future__ import annotations

import os

REHEARSAL_ENV = "PLATFORM_REHEARSAL"
REHEARSAL_CPU = "cpu"


def cpu_rehearsal() -> bool:
    return os.environ.get(REHEARSAL_ENV) == REHEARSAL_CPU

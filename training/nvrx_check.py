"""`--check-args` of training/nvrx_fsdp.py, answered before torch is imported where torch has nothing to say.

Each NVRx pod checks its command line first (k8s/charts/nvrx_job.py), then ft_launcher starts the ranks, each of
which imports torch and transformers. The check needs torch only to ask CUDA whether a device is visible
(--device cuda or auto); on CPU (--device cpu, or a CPU rehearsal, training/rehearsal.py) it would import both
for nothing, once more per pod.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from training.nvrx_config import Job, parse_command
from training.rehearsal import cpu_rehearsal


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

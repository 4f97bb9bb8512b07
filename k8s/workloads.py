"""Typed settings of the workloads the charts emit (validated on construction)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from k8s.ray_spec import WorkloadError

_PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")


def require_pinned_packages(field: str, requirements: tuple[str, ...]) -> None:
    """Packages installed at job start must be pinned exactly (name==version), like the images."""
    for requirement in requirements:
        if not _PINNED_REQUIREMENT.match(requirement):
            raise WorkloadError(f"{field} entry {requirement!r} is not pinned; write it as name==version")


@dataclass(frozen=True, kw_only=True)
class RayFinetuneJob:
    """The Qwen2.5-1.5B FSDP fine-tune (training/ray_finetune.py) as a RayJob."""

    name: str = "qwen-finetune"
    model: str = "Qwen/Qwen2.5-1.5B"
    steps: int = 200
    batch_size: int = 4
    seq_len: int = 1024
    data: str = "synthetic"
    # The GPU node group the job's own cluster uses; None: the environment's first.
    gpu_group: str | None = None
    # Extra packages at submit time through runtime_env; pinned and checked by the runtime-packages gate against the
    # image's facts (k8s/images.lock.json). None by default: the Ray DLC ships transformers 5.13.0, and installing
    # another version would replace it (and its tokenizers) under the image's other packages.
    pip: tuple[str, ...] = ()
    active_deadline_seconds: int = 6 * 3600
    ttl_seconds_after_finished: int = 3600
    backoff_limit: int = 0

    def __post_init__(self) -> None:
        for field, value in (("steps", self.steps), ("batch_size", self.batch_size), ("seq_len", self.seq_len)):
            if value < 1:
                raise WorkloadError(f"ray_finetune.{field}={value} must be at least 1")
        require_pinned_packages("ray_finetune.pip", self.pip)
        if self.active_deadline_seconds < 60:
            raise WorkloadError(f"ray_finetune.active_deadline_seconds={self.active_deadline_seconds} is below 60")

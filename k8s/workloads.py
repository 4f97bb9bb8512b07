"""Typed settings of the workloads the charts emit (validated on construction)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from k8s.ray_spec import WorkloadError
from training.fabric_gate import GateConfig

# A gated RayJob's retries: one fewer than the gate's failures per run, so that each retryable gate failure re-places
# the workers once and the last one (exit 76) is final.
GATE_RETRIES = GateConfig().max_failures - 1

_PINNED_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")


def require_pinned_packages(field: str, requirements: tuple[str, ...]) -> None:
    """Packages installed at job start must be pinned exactly (name==version), like the images."""
    for requirement in requirements:
        if not _PINNED_REQUIREMENT.match(requirement):
            raise WorkloadError(f"{field} entry {requirement!r} is not pinned; write it as name==version")


@dataclass(frozen=True, kw_only=True)
class RayClusterConfig:
    """The long-lived RayCluster (k8s/charts/ray.py): a head and `workers` whole-node workers of one GPU node group, a
    fixed count (no autoscaler: k8s/charts/ray.py RayClusterChart says why)."""

    # `trainctl submit` finds the head of the RayCluster of this name (trainctl/eks_auth.py RAY_CLUSTER).
    name: str = "training"
    # The GPU node group whose workers it starts; None: the environment's first. One group per cluster: a Ray job
    # on it runs on one GPU type.
    gpu_group: str | None = None
    # 0: the head alone, holding no GPU quota; every GPU group deploys at 0 nodes. Give it workers once the group's
    # nodes exist (docs/workloads.md): Kueue then admits head and workers again as one gang, through waitForPodsReady.
    workers: int = 0

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise WorkloadError(f"ray_cluster.workers={self.workers} must be 0 or more")


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
    # With shutdownAfterJobFinishes, KubeRay deletes the job's RayCluster this long after the job ends (KubeRay
    # RayJob docs, ttlSecondsAfterFinished). Kueue v0.19.2 counts the RayJob Finished, and frees its quota, as soon
    # as JobDeploymentStatus is Complete or Failed (pkg/controller/jobs/rayjob/rayjob_controller.go Finished), so
    # for this long the cluster's GPU workers run outside any quota and a newly admitted workload cannot place its
    # pods. At most a minute. The driver log (with the workers' NCCL lines, RAY_DEDUP_LOGS=0 and log_to_driver)
    # outlives the cluster in the submitter pod (`kubectl logs -n ray job/<name>`); weights are on the claim.
    ttl_seconds_after_finished: int = 60
    # KubeRay v1.7.0 retries a Failed RayJob on a new RayCluster (new pods, which the scheduler places with the fabric
    # gate's taint in force) while status.failed < backoffLimit + 1, for any failure except DeadlineExceeded: there
    # is no exit-code filter (rayjob_controller.go checkBackoffLimitAndUpdateStatusIfNeeded). A gated job needs
    # GATE_RETRIES; each also runs a failed fine-tune once more, from step 0 (it does not resume).
    backoff_limit: int = GATE_RETRIES
    # The fabric gate before step 1 (training/fabric_gate.py), on whenever the job's cluster has 2 or more nodes.
    fabric_gate: bool = True

    def __post_init__(self) -> None:
        for name, value in (("steps", self.steps), ("batch_size", self.batch_size), ("seq_len", self.seq_len)):
            if value < 1:
                raise WorkloadError(f"ray_finetune.{name}={value} must be at least 1")
        require_pinned_packages("ray_finetune.pip", self.pip)
        if self.active_deadline_seconds < 60:
            raise WorkloadError(f"ray_finetune.active_deadline_seconds={self.active_deadline_seconds} is below 60")
        if not 0 <= self.backoff_limit <= 10:
            raise WorkloadError(f"ray_finetune.backoff_limit={self.backoff_limit} must be 0 to 10")
        if self.fabric_gate and self.backoff_limit < GATE_RETRIES:
            raise WorkloadError(
                f"ray_finetune.backoff_limit={self.backoff_limit} is below {GATE_RETRIES} with fabric_gate on: a gate "
                "failure would fail the RayJob for good instead of re-placing its workers off the tainted node; set "
                f"backoff_limit={GATE_RETRIES} or more (KubeRay retries a RayJob on a new cluster only through it)"
            )
        if not 0 <= self.ttl_seconds_after_finished <= 60:
            raise WorkloadError(
                f"ray_finetune.ttl_seconds_after_finished={self.ttl_seconds_after_finished} must be 0 to 60: Kueue "
                "frees the job's quota when it finishes while its GPU workers stay up this long; read the driver log "
                "from the submitter pod instead (kubectl logs -n ray job/<name>)"
            )

"""cdk8s app: one chart set per environment, written to dist/<env>/.

Run through `cdk8s synth` (cdk8s.yaml), which sets CDK8S_OUTDIR. The workload charts need
every image pinned by digest: with a digest missing, the namespaces and the training-code
ConfigMap are still written, then synth fails listing each unpinned image and the remedies.
IMAGE_LOCK points at another lock file (make check uses one; see k8s/check_lock.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cdk8s

from infra.spec import ENVIRONMENTS, Environment
from infra.spec.namespaces import FABRIC_GATE_SYSTEM, RAY, TRAINING, TRAINING_NAMESPACES
from k8s.charts.fabric import FabricJob, FabricJobsChart
from k8s.charts.fabric_gate import CONTROLLER_IMAGE, FabricGate
from k8s.charts.namespaces import NamespacesChart
from k8s.charts.nvrx_job import NvrxJobChart, nvrx_job_image
from k8s.charts.ray import RayClusterChart, RayJobChart, TrainingCodeChart
from k8s.images import LOCK_PATH, ImageLock, ImagesNotReadyError, UnbuiltImageError, UnpinnedImagesError
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.ray_spec import RAY_IMAGE
from k8s.system_pods import check_ray_system_pods
from k8s.workloads import RayFinetuneJob


def build(app: cdk8s.App, environment: Environment, lock: ImageLock) -> None:
    """Every chart of one environment, added to `app`; raises UnpinnedImagesError first."""
    if not environment.gpu_node_groups:
        NamespacesChart(
            app,
            "namespaces",
            environment=environment.name,
            namespaces=TRAINING_NAMESPACES,
            vpc_cidr=environment.network.cidr,
        )
        return
    namespaces = NamespacesChart(
        app,
        "namespaces",
        environment=environment.name,
        namespaces=(*TRAINING_NAMESPACES, FABRIC_GATE_SYSTEM),
        vpc_cidr=environment.network.cidr,
    )
    TrainingCodeChart(app, "training-code", namespaces=(RAY.name, TRAINING.name))
    nvrx_job = NvrxFsdpJob()
    nvrx_image = nvrx_job_image(environment, nvrx_job)
    errors: list[UnpinnedImagesError] = []
    try:
        lock.require_pinned([RAY_IMAGE, CONTROLLER_IMAGE, *([nvrx_image] if nvrx_image in lock.images else [])])
    except UnpinnedImagesError as exc:
        errors.append(exc)
    if nvrx_image not in lock.images:
        errors.append(UnbuiltImageError(nvrx_image, environment.name))
    if errors:
        raise errors[0] if len(errors) == 1 else ImagesNotReadyError(errors)
    # The gated workloads' identity (the NVRx job in training, the RayJob's workers in ray) and the controller that
    # acts on their verdicts, in the namespaces' file: no apply step can leave them out.
    FabricGate(namespaces, "fabric-gate", environment=environment, lock=lock, namespaces=(RAY.name, TRAINING.name))
    cluster = RayClusterChart(app, "ray-cluster", environment=environment, lock=lock)
    finetune = RayJobChart(app, "ray-finetune", environment=environment, lock=lock, job=RayFinetuneJob())
    # Both may run at once: their heads (and the submitter) must each get a system node (issue 22 #1).
    workloads = [("RayCluster", cluster.workload_name, cluster.spec), ("RayJob", finetune.workload_name, finetune.spec)]
    check_ray_system_pods(environment, workloads)
    # One file each: the check and the A/B job both take every node of a two-node group.
    FabricJobsChart(app, "fabric-check", environment=environment, lock=lock, kind=FabricJob.CHECK)
    FabricJobsChart(app, "fabric-ab", environment=environment, lock=lock, kind=FabricJob.AB)
    NvrxJobChart(app, "nvrx-fsdp", environment=environment, lock=lock, job=nvrx_job)


def synth_all(outdir: Path, lock: ImageLock | None = None) -> list[Path]:
    """Write every environment; if images are unpinned, write what needs none, then raise."""
    lock = lock or ImageLock.load(LOCK_PATH)
    written: list[Path] = []
    unpinned: list[UnpinnedImagesError] = []
    for environment in ENVIRONMENTS.values():
        app = cdk8s.App(outdir=str(outdir / environment.name))
        try:
            build(app, environment, lock)
        except UnpinnedImagesError as exc:
            unpinned.append(exc)
        app.synth()
        written.append(outdir / environment.name)
    if unpinned:
        raise unpinned[0] if len(unpinned) == 1 else ImagesNotReadyError(unpinned)
    return written


def main() -> int:
    lock_path = Path(os.environ.get("IMAGE_LOCK", LOCK_PATH))
    try:
        synth_all(Path(os.environ.get("CDK8S_OUTDIR", "dist")), ImageLock.load(lock_path))
    except UnpinnedImagesError as exc:
        print(f"error: workload manifests not written.\n{exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

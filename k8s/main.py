"""cdk8s app: one chart set per environment, written to dist/<env>/.

`make synth` runs it as `python -m k8s.main` (`--output DIR`; without it CDK8S_OUTDIR, which `cdk8s synth` sets through
cdk8s.yaml, or dist). A chart is written only where the lock pins every image it runs: the namespaces and the
training-code ConfigMaps always, the fabric gate (in the namespaces' file) with the controller's image, the Ray charts
and fabric jobs with the Ray image, the NVRx job with its built image, and each gated workload with the gate. The rest
are listed, each with the command that fixes it, and the exit status is 1.
IMAGE_LOCK points at another lock file (make check uses one; see k8s/check_lock.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import cdk8s

from infra.spec import ENVIRONMENTS, Environment
from infra.spec.images import built_image_name
from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM, FABRIC_GATE_SYSTEM, RAY, TRAINING, TRAINING_NAMESPACES
from k8s.charts.capacity_hold import CapacityHold, has_block
from k8s.charts.fabric import FabricJob, FabricJobsChart
from k8s.charts.fabric_gate import FabricGate
from k8s.charts.namespaces import NamespacesChart
from k8s.charts.nvrx_job import NvrxJobChart, nvrx_job_image
from k8s.charts.ray import RayClusterChart, RayJobChart, TrainingCodeChart, job_gated
from k8s.charts.small_controller import CONTROLLER_IMAGE
from k8s.checkpoint_writes import check_checkpoint_writes
from k8s.images import LOCK_PATH, ImageLock, ImageLockError
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.ray_spec import RAY_IMAGE
from k8s.system_pods import check_ray_system_pods
from k8s.workloads import RayFinetuneJob

FABRIC_GATE = "fabric-gate (in namespaces.k8s.yaml)"
CAPACITY_HOLD = "capacity-hold (in namespaces.k8s.yaml)"


@dataclass(frozen=True)
class NotWritten:
    chart: str
    reason: str
    fix: str


class ChartsNotWrittenError(ImageLockError):
    """The charts whose images the lock cannot provide yet; every other chart was written. One entry per missing
    image: what is missing, the command that fixes it, and the charts it holds back."""

    def __init__(self, missing: list[NotWritten]) -> None:
        by_cause: dict[tuple[str, str], list[str]] = {}
        for item in missing:
            by_cause.setdefault((item.reason, item.fix), []).append(item.chart)
        entries = [f"{reason}: {fix}\n  not written: {', '.join(charts)}" for (reason, fix), charts in by_cause.items()]
        super().__init__("\n".join(entries))
        self.missing = missing


def build(app: cdk8s.App, environment: Environment, lock: ImageLock) -> list[NotWritten]:
    """Every chart of one environment whose images the lock pins, added to `app`; the others, returned."""
    if not environment.gpu_node_groups:
        NamespacesChart(
            app,
            "namespaces",
            environment=environment.name,
            namespaces=TRAINING_NAMESPACES,
            vpc_cidr=environment.network.cidr,
        )
        return []
    nvrx_job = NvrxFsdpJob()
    # Before any chart: a job its file system cannot checkpoint in time is refused whatever the lock holds.
    check_checkpoint_writes(environment, nvrx_job)
    block = has_block(environment)
    namespaces = NamespacesChart(
        app,
        "namespaces",
        environment=environment.name,
        namespaces=(*TRAINING_NAMESPACES, FABRIC_GATE_SYSTEM, *((CAPACITY_HOLD_SYSTEM,) if block else ())),
        vpc_cidr=environment.network.cidr,
    )
    TrainingCodeChart(app, "training-code", namespaces=(RAY.name, TRAINING.name))
    skipped: list[NotWritten] = []
    built = built_image_name(environment.name)

    def ready(chart: str, *images: str) -> bool:
        problems = [lock.not_ready(name, built_by=environment.name if name == built else None) for name in images]
        found = [NotWritten(f"{environment.name}/{chart}", *problem) for problem in problems if problem is not None]
        skipped.extend(found)
        return not found

    # A gated workload without the gate's identity (its ServiceAccount) would never start.
    gate = ready(FABRIC_GATE, CONTROLLER_IMAGE)
    with_gate = () if gate else (CONTROLLER_IMAGE,)
    if gate:
        # The gated workloads' identity (the NVRx job in training, the RayJob's workers in ray) and the controller that
        # acts on their verdicts, in the namespaces' file: no apply step can leave them out.
        FabricGate(namespaces, "fabric-gate", environment=environment, lock=lock, namespaces=(RAY.name, TRAINING.name))
    if block and ready(CAPACITY_HOLD, CONTROLLER_IMAGE):
        # Kueue stops admitting onto a block a job admitted there could no longer checkpoint on (capacity_hold/).
        CapacityHold(namespaces, "capacity-hold", environment=environment, lock=lock, nvrx_job=nvrx_job)
    workloads = []
    if ready("ray-cluster", RAY_IMAGE):
        cluster = RayClusterChart(app, "ray-cluster", environment=environment, lock=lock)
        workloads.append(("RayCluster", cluster.workload_name, cluster.spec))
    job = RayFinetuneJob()
    if ready("ray-finetune", RAY_IMAGE, *(with_gate if job_gated(environment, job) else ())):
        finetune = RayJobChart(app, "ray-finetune", environment=environment, lock=lock, job=job)
        workloads.append(("RayJob", finetune.workload_name, finetune.spec))
    # Both may run at once: their heads (and the submitter) must each get a system node (issue 22 #1).
    check_ray_system_pods(environment, workloads)
    # One file each: the check and the A/B job both take every node of a two-node group.
    for name, kind in (("fabric-check", FabricJob.CHECK), ("fabric-ab", FabricJob.AB)):
        if ready(name, RAY_IMAGE):
            FabricJobsChart(app, name, environment=environment, lock=lock, kind=kind)
    if ready("nvrx-fsdp", nvrx_job_image(environment, nvrx_job), *(with_gate if nvrx_job.fabric_gate else ())):
        NvrxJobChart(app, "nvrx-fsdp", environment=environment, lock=lock, job=nvrx_job)
    return skipped


def synth_all(outdir: Path, lock: ImageLock | None = None) -> list[Path]:
    """Empty `outdir`, write every chart the lock allows, and return the files; raise ChartsNotWrittenError listing
    the others."""
    lock = lock or ImageLock.load(LOCK_PATH)
    # As `cdk8s synth` does (cdk8s-cli 2.207.60 lib/cli/cmds/synth.js: fs.rmSync(outdir)): no file of an earlier run
    # stays beside this one's.
    shutil.rmtree(outdir, ignore_errors=True)
    skipped: list[NotWritten] = []
    for environment in ENVIRONMENTS.values():
        app = cdk8s.App(outdir=str(outdir / environment.name))
        skipped += build(app, environment, lock)
        app.synth()
    if skipped:
        raise ChartsNotWrittenError(skipped)
    return sorted(outdir.rglob("*.yaml"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k8s.main", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(os.environ.get("CDK8S_OUTDIR", "dist")))
    args = parser.parse_args(argv)
    lock_path = Path(os.environ.get("IMAGE_LOCK", LOCK_PATH))
    missing: list[NotWritten] = []
    try:
        synth_all(args.output, ImageLock.load(lock_path))
    except ChartsNotWrittenError as exc:
        missing = exc.missing
    except ImageLockError as exc:
        print(f"error: {lock_path}: {exc}", file=sys.stderr)
        return 2
    for path in sorted(args.output.rglob("*.yaml")):
        print(f"  - {path}")
    if missing:
        print(ChartsNotWrittenError(missing), file=sys.stderr)
        charts = len({item.chart for item in missing})
        print(
            f"{charts} chart(s) not written; the others are in {args.output}/. Run each fix, commit "
            "k8s/images.lock.json and run `make synth` again.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The project's own workloads, synthesized through the real charts with small settings and the
check lock (as the `dist` session fixture does), rehearsed as pods on CPU with a tiny model.

Each test asserts what a real run of the workload needs, so a workload defect (issue 17's showed up
here first) fails its test until the workload is fixed; none is marked xfail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import cdk8s
import pytest

from infra.spec import ENVIRONMENTS
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.charts.ray import TrainingCodeChart
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.nvrx_spec import CheckpointPolicy, FtLauncherConfig, NvrxFsdpJob
from rehearse import Options, Rehearsal, run
from tests.image_envs import image_pythons

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]


def nvrx_job(model: Path, **overrides: Any) -> NvrxFsdpJob:
    """The NVRx job in miniature: tiny model, 6 steps, a checkpoint every 2 (so every pod writes one)."""
    small = NvrxFsdpJob(model=str(model), steps=6, batch_size=2, seq_len=32, checkpoint=CheckpointPolicy(every_steps=2))
    return replace(small, **overrides)


def nvrx_manifests(environment: str, job: NvrxFsdpJob, lock: ImageLock) -> list[dict[str, Any]]:
    app = cdk8s.App()
    code = TrainingCodeChart(app, "training-code", namespaces=("training",))
    chart = NvrxJobChart(app, "nvrx-fsdp", environment=ENVIRONMENTS[environment], lock=lock, job=job)
    return [*code.to_json(), *chart.to_json()]


def rehearse(tmp_path: Path, manifests: list[dict[str, Any]], model: Path, **options: Any) -> Rehearsal:
    # A hang guard, not a speed assertion: on a loaded 2-core runner the NVRx fault rehearsals took up to ~240 s.
    options.setdefault("timeout_s", 480.0)
    # With IMAGE_ENVS=1 (make test-image) each image's pods run its own environment (tests/image_envs.py).
    options.setdefault("image_python", image_pythons(check_lock(ImageLock.load())))
    # One rank per pod (rehearse/ranks.py): the chart's 4 per g6 pod cost minutes of imports on 2 cores.
    options.setdefault("ranks_per_pod", 1)
    return run(manifests, Options(output_dir=tmp_path / "out", host_paths=(model,), backoff_base_s=1.0, **options))


def trainer_logs(result: Rehearsal) -> str:
    return "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for w in result.workloads for p in w.pods)


def test_dev_nvrx_job_completes_on_two_pods(tmp_path: Path, tiny_model: Path, lock: ImageLock) -> None:
    # Fail fast instead of retrying a failure no retry can fix: no ft_launcher restart, no pod replacement.
    job = nvrx_job(tiny_model, ft_launcher=FtLauncherConfig(max_restarts=0), backoff_limit=0)
    # Issue 17 (3), before dev had the FSx claim: pod 1's ranks failed with FileNotFoundError at step 2 (a per-pod
    # emptyDir), then ft_launcher on pod 0 kept its rank monitors "handling" and the pods never ended; bounded here.
    result = rehearse(tmp_path, nvrx_manifests("dev", job, lock), tiny_model, timeout_s=120.0)
    nvrx = result.workload("nvrx-fsdp")
    assert nvrx.state == "Complete", f"{nvrx.state} {nvrx.message}\n{trainer_logs(result)}"


def test_prod_nvrx_job_on_the_shared_claim_completes_on_two_pods(
    tmp_path: Path, tiny_model: Path, lock: ImageLock
) -> None:
    job = nvrx_job(tiny_model, gpu_group="g6")
    result = rehearse(tmp_path, nvrx_manifests("prod", job, lock), tiny_model)
    nvrx = result.workload("nvrx-fsdp")
    assert nvrx.state == "Complete", f"{nvrx.state} {nvrx.message}\n{trainer_logs(result)}"
    assert [p.hostname for p in nvrx.pods] == ["nvrx-fsdp-0", "nvrx-fsdp-1"]
    # Both pods' ranks wrote into one checkpoint directory on the claim.
    steps = sorted((tmp_path / "out/claims/training/checkpoints/nvrx-fsdp").glob("step*"))
    assert steps, sorted((tmp_path / "out/claims/training").rglob("*"))[:20]
    assert "nvidia.com/gpu" in nvrx.pods[0].accelerators

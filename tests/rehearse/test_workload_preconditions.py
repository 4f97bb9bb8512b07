"""Issue 17 in rehearsal: the NVRx pods check their own arguments and preconditions before ft_launcher starts
(exit 2, so the Job's podFailurePolicy fails the Job at once), the checkpoint directory is shared across the
job's pods (markers under the Job's uid), and dev's job survives the loss of a pod on its FSx claim."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k8s.images import ImageLock
from k8s.nvrx_spec import NvrxFsdpJob
from rehearse import Kill
from tests.rehearse.test_workloads import nvrx_job, nvrx_manifests, rehearse, trainer_logs

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
DEV_CLAIM = Path("claims/training/checkpoints/nvrx-fsdp")


@dataclass(frozen=True, kw_only=True)
class ExtraArgsJob(NvrxFsdpJob):
    """Test only: the chart's job with extra training arguments (a typo a user could make in a fork)."""

    extra_argv: tuple[str, ...] = ()

    def training_argv(self, *, store_host: str, gate_flags: list[str] | None = None) -> list[str]:
        return [*super().training_argv(store_host=store_host, gate_flags=gate_flags), *self.extra_argv]


def with_extra_args(model: Path, *extra: str) -> ExtraArgsJob:
    base = nvrx_job(model)
    fields = {name: getattr(base, name) for name in NvrxFsdpJob.__dataclass_fields__}
    return ExtraArgsJob(**fields, extra_argv=extra)


def test_a_bad_training_flag_fails_the_job_at_once_through_its_exit_2_rule(
    tmp_path: Path, tiny_model: Path, lock: ImageLock
) -> None:
    """Issue 17 #6: ft_launcher turns a worker's exit 2 into its own exit 1, so the rule never fired and a bad
    flag burned every ft_launcher restart on every pod, then every pod replacement (backoffLimit)."""
    job = with_extra_args(tiny_model, "--no-such-flag")
    result = rehearse(tmp_path, nvrx_manifests("dev", job, lock), tiny_model, timeout_s=180.0)
    nvrx = result.workload("nvrx-fsdp")
    assert (nvrx.state, nvrx.message.split(":")[0]) == ("Failed", "PodFailurePolicy"), trainer_logs(result)
    assert nvrx.wall_s < 60, nvrx.wall_s
    # No replacement pod, and ft_launcher never started.
    assert len(nvrx.pods) <= 2
    for pod in nvrx.pods:
        assert pod.exit_codes["trainer"] in (2, 137, None), pod.exit_codes  # 137: terminated by the failed Job
        assert "ft_launcher" not in pod.log() or "unrecognized arguments: --no-such-flag" in pod.log()
    assert any("unrecognized arguments: --no-such-flag" in p.log() for p in nvrx.pods), trainer_logs(result)


def _unshared(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Job with its checkpoint claim swapped for a per-pod emptyDir (what dev had before issue 17)."""
    for obj in manifests:
        if obj["kind"] == "Job":
            volumes = obj["spec"]["template"]["spec"]["volumes"]
            for i, volume in enumerate(volumes):
                if volume["name"] == "checkpoints":
                    volumes[i] = {"name": "checkpoints", "emptyDir": {}}
    return manifests


def test_pods_that_do_not_share_the_checkpoint_directory_fail_their_check_by_name(
    tmp_path: Path, tiny_model: Path, lock: ImageLock
) -> None:
    job = nvrx_job(tiny_model, preconditions_timeout_s=10)
    result = rehearse(tmp_path, _unshared(nvrx_manifests("dev", job, lock)), tiny_model, timeout_s=180.0)
    nvrx = result.workload("nvrx-fsdp")
    assert (nvrx.state, nvrx.message.split(":")[0]) == ("Failed", "PodFailurePolicy"), trainer_logs(result)
    logs = trainer_logs(result)
    assert "FAIL shared dir: /checkpoints/nvrx-fsdp is not shared: after 10 s this pod sees the markers of pods" in logs
    assert "pod preconditions failed: shared dir" in logs
    # Markers are per run: under the Job's uid (the apiserver's batch.kubernetes.io/controller-uid label).
    assert nvrx.uid
    markers = sorted(tmp_path.glob(f"out/pods/*/volumes/checkpoints/nvrx-fsdp/.shared-check/{nvrx.uid}/pod-*"))
    assert [m.name for m in markers] == ["pod-0", "pod-1"], sorted(tmp_path.glob("out/pods/*/volumes/**"))[:20]


def test_dev_nvrx_job_survives_a_lost_pod_on_its_fsx_claim(tmp_path: Path, tiny_model: Path, lock: ImageLock) -> None:
    """Pod 1 lost (DisruptionTarget) once the step-2 checkpoint is committed: replaced without counting, its
    replacement passes the shared-directory check at once (same Job uid), and every rank resumes on the claim."""
    lost = Kill(pod="nvrx-fsdp-1", seconds=0, after=DEV_CLAIM / "step_000000002/COMMITTED")
    result = rehearse(tmp_path, nvrx_manifests("dev", nvrx_job(tiny_model), lock), tiny_model, kills=(lost,))
    nvrx = result.workload("nvrx-fsdp")
    assert nvrx.state == "Complete", f"{nvrx.state} {nvrx.message} {result.notes}\n{trainer_logs(result)}"
    assert [p.hostname for p in nvrx.pods] == ["nvrx-fsdp-0", "nvrx-fsdp-1", "nvrx-fsdp-1"]
    assert nvrx.pods[1].conditions[0]["type"] == "DisruptionTarget"
    assert "ok   shared dir: /checkpoints/nvrx-fsdp is seen by all 2 pods" in nvrx.pods[2].log()
    steps = sorted(p.name for p in (tmp_path / "out" / DEV_CLAIM).glob("step_*"))
    assert steps, sorted((tmp_path / "out/claims").rglob("*"))[:20]

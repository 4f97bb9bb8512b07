"""The NVRx job on a Capacity Block group (k8s/capacity_deadline.py): the block's end, the stop margin and the step
time on the trainer, the pod's supervisor even without the fabric gate, and FailJob on the deadline's codes."""

from __future__ import annotations

import dataclasses
from typing import Any

import cdk8s
import pytest

from infra.spec import ENVIRONMENTS, Capacity, CapacityKind, Environment, Scaling
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.ray_spec import WorkloadError
from tests.k8s.test_nvrx_chart import LOCK

END = "2026-12-10T11:30:00+00:00"


def on_block(end: str | None) -> Environment:
    prod = ENVIRONMENTS["prod"]
    group = prod.gpu_node_groups[0]
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end=end)
    scaling = Scaling(min_size=0, desired_size=0, max_size=group.scaling.max_size)
    return dataclasses.replace(prod, gpu_node_groups=(dataclasses.replace(group, capacity=block, scaling=scaling),))


def job_spec(environment: Environment, job: NvrxFsdpJob) -> tuple[NvrxJobChart, dict[str, Any]]:
    chart = NvrxJobChart(cdk8s.Testing.app(), "n", environment=environment, lock=LOCK, job=job)
    (found,) = [o for o in cdk8s.Testing.synth(chart) if o["kind"] == "Job"]
    return chart, found["spec"]


def test_a_job_on_a_block_carries_its_deadline_and_fails_on_its_codes() -> None:
    chart, spec = job_spec(on_block(END), NvrxFsdpJob(step_seconds=2.5, fabric_gate=False))
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["CAPACITY_DEADLINE"], env["CAPACITY_STOP_MARGIN_SECONDS"], env["CAPACITY_STEP_SECONDS"]) == (
        END,
        "2400",
        "2.5",
    )
    fail = [r["onExitCodes"]["values"] for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert [78, 79] in fail
    # Without the supervisor ft_launcher would turn the trainer's 78 into its own exit 1 and the rule never fires.
    assert "exec python -m training.fabric_gate supervise -- ft_launcher " in chart.script


def test_a_job_off_a_block_has_neither() -> None:
    chart, spec = job_spec(ENVIRONMENTS["prod"], NvrxFsdpJob(fabric_gate=False))
    (container,) = spec["template"]["spec"]["containers"]
    assert not [e for e in container["env"] if e["name"].startswith("CAPACITY_")]
    assert not [r for r in spec["podFailurePolicy"]["rules"] if 78 in r.get("onExitCodes", {}).get("values", [])]
    assert "supervise" not in chart.script


@pytest.mark.parametrize(
    ("end", "job", "says"),
    [
        (None, NvrxFsdpJob(step_seconds=2.5), "capacity.end is not set"),
        (END, NvrxFsdpJob(), "nvrx.step_seconds is not set"),
    ],
)
def test_a_job_on_a_block_without_its_end_or_step_time_is_refused(end: str | None, job: NvrxFsdpJob, says: str) -> None:
    with pytest.raises(WorkloadError, match=says):
        job_spec(on_block(end), job)

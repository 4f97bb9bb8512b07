"""A Capacity Block ending mid-run on the cluster model (the real NVRx chart, controllers, scheduler and Kueue
emulator over the fake runtime, milliseconds): every trainer stops at the block's stop point with exit 78 (what the
pod's supervisor exits with, tests/training/test_capacity_stop.py), the Job fails at once by its FailJob rule - no
pod retried onto the ending block, Kueue's workload finished, not requeued - and the next job in the queue is
admitted onto the freed capacity. The data side (the stop's checkpoint, the bit-identical resume) is the process
test's; re-applying the same Job on the next capacity is not modelled."""

from __future__ import annotations

import dataclasses
from typing import Any

import cdk8s

from infra.spec import ENVIRONMENTS, Capacity, CapacityKind, Environment
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.nvrx_spec import NvrxFsdpJob
from rehearse.fake import FakeRuntime, Script
from tests.k8s.test_nvrx_chart import LOCK
from tests.rehearse.cluster.test_cluster_loop import rehearse
from training.deadline import EXIT_STOPPED

# The block's stop point, in cluster seconds after the pods start: mid-run.
STOP_S = 3000


def block_dev() -> Environment:
    dev = ENVIRONMENTS["dev"]
    (group, *others) = dev.gpu_node_groups
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end="2026-12-10T11:30Z")
    return dataclasses.replace(dev, gpu_node_groups=(dataclasses.replace(group, capacity=block), *others))


def job_manifests(name: str) -> list[dict[str, Any]]:
    job = NvrxFsdpJob(name=name, gpu_group="g6", nodes=2, step_seconds=2.0, fabric_gate=False)
    chart = NvrxJobChart(cdk8s.App(), name, environment=block_dev(), lock=LOCK, job=job)
    return [o for o in chart.to_json() if o["kind"] == "Job"]


def test_a_block_ending_mid_run_fails_the_job_without_retries_and_frees_the_queue() -> None:
    runtime = FakeRuntime(
        {
            # A retry would be a second attempt that completes: the Job must not get there.
            **{f"stopped-{i}-": [Script(code=EXIT_STOPPED, after_s=STOP_S), Script(after_s=60)] for i in (0, 1)},
            "next-": [Script(after_s=600)],
        }
    )
    result = rehearse([*job_manifests("stopped"), *job_manifests("next")], runtime, gpu_nodes={"g6": 2})
    stopped, after = result.workload("stopped"), result.workload("next")
    assert stopped.state == "Failed", stopped.message
    assert "exit code 78 matching FailJob rule" in stopped.message
    assert len(stopped.pods) == 2  # one attempt per index
    assert all(p.end_s is not None and p.end_s - (p.start_s or 0) == STOP_S for p in stopped.pods)
    assert stopped.admission is not None
    assert stopped.admission["requeues"] == []
    assert after.state == "Complete", after.message
    assert min(p.start_s or 0 for p in after.pods) >= max(p.end_s or 0 for p in stopped.pods)

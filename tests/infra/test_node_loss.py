"""What losing a node costs (infra/spec/node_loss.py) and the two settings sized from it: Kueue's recoveryTimeout
and the NVRx Job's backoffLimit (issue 22 #7)."""

from __future__ import annotations

import cdk8s

from infra.spec import ENVIRONMENTS
from infra.spec.kueue import KueueProps, manager_config
from infra.spec.node_loss import (
    NODE_MONITOR_GRACE_S,
    NODE_REPLACEMENT_S,
    UNREACHABLE_TOLERATION_S,
    lost_node_recovery_s,
)
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.nvrx_spec import NvrxFsdpJob


def test_recovery_timeout_outlasts_a_lost_nodes_eviction_replacement_and_cold_start() -> None:
    props = KueueProps()
    # A node that stops answering: marked unreachable after the grace period, its pods evicted when their default
    # toleration runs out, a new instance launched and joined, then the image pulled cold as on any fresh node.
    needed = (
        NODE_MONITOR_GRACE_S + UNREACHABLE_TOLERATION_S + NODE_REPLACEMENT_S + props.pods_ready_timeout_minutes * 60
    )
    assert lost_node_recovery_s(props.pods_ready_timeout_minutes * 60) == needed
    rendered = manager_config(props)["waitForPodsReady"]["recoveryTimeout"]
    assert int(rendered.removesuffix("m")) * 60 >= needed, (
        f"recoveryTimeout {rendered}: Kueue would evict the whole gang {needed} s into a node loss it would survive"
    )


def _job_spec(nodes: int, job: NvrxFsdpJob) -> dict[str, object]:
    chart = NvrxJobChart(
        cdk8s.Testing.app(), "n", environment=ENVIRONMENTS["prod"], lock=check_lock(ImageLock.load()), job=job
    )
    (spec,) = [o["spec"] for o in cdk8s.Testing.synth(chart) if o["kind"] == "Job"]
    assert spec["completions"] == nodes
    return dict(spec)


def test_the_nvrx_job_survives_two_losses_of_pod_0_on_any_number_of_nodes() -> None:
    # Each loss of pod 0 fails the launcher of every other pod (rehearsed in tests/rehearse/test_nvrx_faults.py),
    # which the Job counts: nodes - 1 per loss. Kubernetes fails the Job once the count exceeds backoffLimit.
    for nodes in (4, 8, 2):
        job = NvrxFsdpJob(gpu_group="p5", nodes=nodes)
        spec = _job_spec(nodes, job)
        assert spec["backoffLimit"] == 2 * (nodes - 1), f"{nodes} nodes: backoffLimit {spec['backoffLimit']}"
        assert job.backoff_limit_for(nodes) == spec["backoffLimit"]
    assert _job_spec(2, NvrxFsdpJob(gpu_group="p5", nodes=2, backoff_limit=5))["backoffLimit"] == 5

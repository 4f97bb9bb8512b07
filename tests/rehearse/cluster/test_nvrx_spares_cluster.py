"""The NVRx job's hot spares on the cluster model, fake runtime (milliseconds): Kueue admits the Job only when the
quota covers its standby pods too, and a lost node's replacement that can never run (its rendezvous store is gone
with pod 0) does not keep the Job from completing once pod 0 succeeded (the chart's successPolicy). The Job's
fields are the prod chart's with spares=1 (k8s/charts/nvrx_job.py); the pods are test_cluster_loop's whole g6 nodes."""

from __future__ import annotations

import cdk8s

from infra.spec import ENVIRONMENTS
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob
from rehearse.cluster.placement import NodeKill
from rehearse.fake import FakeRuntime, Script
from tests.rehearse.cluster.test_cluster_loop import gpu_job, rehearse


def spares_job(name: str) -> dict[str, object]:
    lock = check_lock(ImageLock.load()).with_digest(NVRX_IMAGE, "sha256:" + "0" * 64)
    chart = NvrxJobChart(
        cdk8s.Testing.app(), "n", environment=ENVIRONMENTS["prod"], lock=lock, job=NvrxFsdpJob(spares=1)
    )
    fields = ("completions", "parallelism", "successPolicy", "podFailurePolicy")
    job = gpu_job(name, pods=chart.pods, **{k: chart.spec[k] for k in fields})
    job["spec"]["backoffLimit"] = chart.spec["backoffLimit"]
    return job


def test_the_standby_pod_needs_quota_like_the_active_ones() -> None:
    result = rehearse([spares_job("nvrx")], FakeRuntime({"nvrx-": [Script(after_s=60)]}), gpu_nodes={"g6": 2})
    job = result.workload("nvrx")
    assert job.state == "Timeout"
    assert job.admission is not None
    assert job.admission["admitted"] is False


def test_a_lost_node_with_a_spare_the_job_completes_when_pod_0_does() -> None:
    # Index 1's node is lost at 100 s (the standby takes its ranks: pods 0 and 2 carry on); its replacement exists only
    # after the eviction (450 s) and waits for a node. Pod 0 finishes the training at 600 s: the Job is Complete then,
    # without the replacement (which would find no rendezvous store and fail) or pod 2's exit.
    runtime = FakeRuntime(
        {
            "nvrx-0": [Script(after_s=600)],
            "nvrx-1": [Script(after_s=5000), Script(code=1, after_s=5)],
            "nvrx-2": [Script(after_s=5000)],
        }
    )
    result = rehearse(
        [spares_job("nvrx")], runtime, gpu_nodes={"g6": 3}, node_kills=(NodeKill(node="g6-1", seconds=100),)
    )
    job = result.workload("nvrx")
    assert job.state == "Complete", job.message
    assert job.admission is not None
    assert job.admission["admitted"] is True
    ends = [p.end_s for p in job.pods if p.end_s is not None]
    assert max(ends) < 700, ends

"""A Capacity Block ending mid-run on the cluster model (the real NVRx chart, controllers, scheduler and Kueue
emulator over the fake runtime, milliseconds): every trainer stops at the block's stop point with exit 78 (what the
pod's supervisor exits with, tests/training/test_capacity_stop.py), the Job fails at once by its FailJob rule - no
pod retried onto the ending block, Kueue's workload finished, not requeued - and the next job in the queue is
admitted onto the freed capacity; with the hold controller (capacity_hold/, its emitted identity and policy through the
rehearsal's API server), that next job is not admitted onto the ending block but waits for the next block's end to be
deployed. The data side (the stop's checkpoint, the bit-identical resume) is the process
test's; re-applying the same Job on the next capacity is not modelled."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import cdk8s

from capacity_hold.config import HoldConfig
from capacity_hold.decide import HOLD_REASON, RELEASED_REASON, iso
from capacity_hold.loop import Controller
from infra.spec import ENVIRONMENTS, Capacity, CapacityKind, Environment
from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM
from k8s.charts.capacity_hold import CONFIG_CONFIGMAP as HOLD_CONFIG
from k8s.charts.capacity_hold import CONTROLLER as HOLD_CONTROLLER
from k8s.charts.capacity_hold import CapacityHold
from k8s.charts.namespaces import NamespacesChart
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.nvrx_spec import NvrxFsdpJob
from rehearse.cluster.apiserver import ClusterApi
from rehearse.fake import FakeRuntime, Script
from rehearse.pods import Pod
from tests.k8s.test_nvrx_chart import LOCK
from tests.rehearse.cluster.test_cluster_loop import rehearse
from training.deadline import EXIT_STOPPED
from training.kube_api import API_TOKEN_ENV, KubeApi

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


# The hold, in the same cluster seconds: the block's stop point is at STOP_S; with the default startup (1,200 s) and
# 600 steps x 2 s to the first checkpoint (job_manifests), a job admitted later than STOP_S - 2,400 s could not save.
HOLD_S = STOP_S - 2400
NEXT_BLOCK_S = 4000


def hold_objects() -> list[dict[str, Any]]:
    """The hold controller's namespace, identity, policy, config and Deployment, as synth emits them for the block."""
    app = cdk8s.App()
    chart = NamespacesChart(
        app,
        "namespaces",
        environment="dev",
        namespaces=(CAPACITY_HOLD_SYSTEM,),
        vpc_cidr=ENVIRONMENTS["dev"].network.cidr,
    )
    job = NvrxFsdpJob(name="stopped", gpu_group="g6", nodes=2, step_seconds=2.0, fabric_gate=False)
    CapacityHold(chart, "capacity-hold", environment=block_dev(), lock=LOCK, nvrx_job=job)
    return list(chart.to_json())


class HoldingRuntime(FakeRuntime):
    """The fake runtime; on every poll the hold controller (capacity_hold.loop.Controller, its config read from the
    emitted ConfigMap) takes one poll with its Deployment pod's token, on a wall clock whose stop point is STOP_S. At
    NEXT_BLOCK_S the next block's end (a day later) is deployed: the controller's config changes."""

    def __init__(self, manifests: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        (config_map,) = [m for m in manifests if m["kind"] == "ConfigMap" and m["metadata"]["name"] == HOLD_CONFIG]
        self.config = HoldConfig.from_json(json.loads(config_map["data"]["config.json"]))
        group = self.config.groups["g6"]
        self.epoch = group.end_s() - group.stop_margin_s - STOP_S
        self.api: ClusterApi | None = None
        self.controller: Controller | None = None
        self.logs: list[str] = []
        self.written: list[tuple[float, str | None]] = []
        self.polled = -float("inf")

    def serve(self, api: ClusterApi) -> None:
        self.api = api

    def poll(self) -> list[Pod]:
        pods = [p for p in self.pods.values() if p.name.startswith(f"{HOLD_CONTROLLER}-") and p.running]
        if self.api is not None and pods:
            (pod,) = pods
            if self.controller is None:
                token = self.api.pod_env(pod.plan)[API_TOKEN_ENV]
                clock = lambda: self.epoch + self.clock.now()  # noqa: E731
                self.controller = Controller(
                    KubeApi(self.api.url, token), self.config, clock=clock, log=self.logs.append
                )
            if self.clock.now() >= NEXT_BLOCK_S and self.controller.config is self.config:
                later = {**self.config.to_json()}
                later["groups"]["g6"]["end"] = iso(self.config.groups["g6"].end_s() + 86400)
                self.controller.reload(lambda: HoldConfig.from_json(later))
            if self.clock.now() - self.polled >= self.config.poll_s:  # polls as often as the Deployment's
                self.polled = self.clock.now()
                self.written += [(self.clock.now(), d.policy) for d in self.controller.tick()]
        return super().poll()


def test_the_hold_admits_nothing_onto_a_block_a_job_could_not_checkpoint_on_until_the_next_block_is_deployed() -> None:
    objects = hold_objects()
    manifests = [*objects, *job_manifests("stopped"), *job_manifests("next")]
    stops = {f"stopped-{i}-": [Script(code=EXIT_STOPPED, after_s=STOP_S)] for i in (0, 1)}
    runtime = HoldingRuntime(objects, scripts={**stops, "next-": [Script(after_s=600)]})
    result = rehearse(manifests, runtime, gpu_nodes={"g6": 2}, serve=runtime.serve)
    assert runtime.api is not None
    report = runtime.api.report()
    stopped, after = result.workload("stopped"), result.workload("next")
    assert stopped.state == "Failed", stopped.message
    assert "exit code 78 matching FailJob rule" in stopped.message
    # Without the hold `next` is admitted onto the block at STOP_S (the test above), where it could not reach its
    # first checkpoint; held from HOLD_S, it waits until the next block's end is deployed.
    (hold_at, hold), (release_at, release) = runtime.written
    assert (hold, release) == ("Hold", "None")
    assert HOLD_S <= hold_at < HOLD_S + runtime.config.poll_s, runtime.written
    assert NEXT_BLOCK_S <= release_at < NEXT_BLOCK_S + runtime.config.poll_s, runtime.written
    assert after.state == "Complete", after.message
    assert min(p.start_s or 0 for p in after.pods) >= NEXT_BLOCK_S, [p.start_s for p in after.pods]
    patches = [a for a in report["actions"] if "stopPolicy" in a]
    assert [a.split(", ")[-1] for a in patches] == ["stopPolicy Hold", "stopPolicy None"], patches
    assert all(a.startswith(f"system:serviceaccount:capacity-hold-system:{HOLD_CONTROLLER} ") for a in patches)
    reasons = [(e["namespace"], e["involvedObject"]["kind"], e["reason"]) for e in report["events"]]
    assert reasons == [("default", "ClusterQueue", HOLD_REASON), ("default", "ClusterQueue", RELEASED_REASON)]
    assert "cannot reach its first checkpoint" in report["events"][0]["message"]

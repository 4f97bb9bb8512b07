"""The run loop's seams (rehearse/seams.py) on the fake runtime: placement can hold pods Pending, admission can
hold and evict workloads; the defaults change nothing."""

from __future__ import annotations

from typing import Any

from rehearse.fake import FakeRuntime, Script, rehearse_fake
from rehearse.pods import Pod, PodPlan
from rehearse.seams import AlwaysAdmit, Pending, WorkloadRef


def job(name: str, *, completions: int = 1, parallelism: int = 1, backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "completionMode": "Indexed",
            "backoffLimit": backoff_limit,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}},
        },
    }


class OneAtATime:
    """A single node with room for one pod."""

    def __init__(self) -> None:
        self.busy: str | None = None
        self.asked: list[str] = []

    def place(self, plan: PodPlan) -> str | Pending | None:
        self.asked.append(plan.name)
        if self.busy is not None:
            return Pending("0/1 nodes are available: 1 Insufficient cpu")
        self.busy = plan.name
        return "node-a"

    def release(self, pod: Pod) -> None:
        if self.busy == pod.name:
            self.busy = None


def test_pods_wait_pending_for_placement_and_run_on_the_node_they_were_given() -> None:
    placement = OneAtATime()
    result = rehearse_fake([job("j", completions=3, parallelism=3)], placement=placement)
    w = result.workload("j")
    assert w.state == "Complete", w.message
    assert [p.node for p in w.pods] == ["node-a"] * 3
    # Started one after the other: each pod's wall time covers the ones placed before it.
    assert sorted(round(p.wall_s) for p in w.pods) == [1, 2, 3]


def test_a_pod_never_placed_is_reported_pending_with_its_reason_at_the_timeout() -> None:
    class Nowhere:
        def place(self, plan: PodPlan) -> str | Pending | None:
            return Pending("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector")

        def release(self, pod: Pod) -> None:
            return None

    result = rehearse_fake([job("j")], placement=Nowhere(), timeout_s=5.0)
    w = result.workload("j")
    assert w.state == "Timeout"
    assert w.pods[0].phase == "Pending"
    assert "node affinity" in w.pods[0].pending_reason


class Quota(AlwaysAdmit):
    """Admits one workload at a time; evicts the first admitted one once its first pod is ready."""

    def __init__(self) -> None:
        self.admitted: WorkloadRef | None = None
        self.events: list[str] = []
        self.evict: list[tuple[WorkloadRef, str]] = []
        self.evicted_once = False

    def admit(self, workload: WorkloadRef) -> bool | Pending:
        if self.admitted is not None and self.admitted != workload:
            return Pending("insufficient quota in ClusterQueue q")
        self.admitted = workload
        self.events.append(f"admit {workload.name}")
        return True

    def pod_ready(self, workload: WorkloadRef, pod: Pod) -> None:
        self.events.append(f"ready {workload.name}")
        if not self.evicted_once:
            self.evicted_once = True
            self.evict.append((workload, "PodsReady timeout"))

    def pod_ended(self, workload: WorkloadRef, pod: Pod) -> None:
        self.events.append(f"ended {workload.name} {pod.phase}")

    def workload_finished(self, workload: WorkloadRef, state: str) -> None:
        self.events.append(f"finished {workload.name} {state}")
        if self.admitted == workload:
            self.admitted = None

    def evictions(self) -> list[tuple[WorkloadRef, str]]:
        out, self.evict = self.evict, []
        if out:
            self.admitted = None
        return out


def test_admission_holds_a_workload_until_quota_frees_and_an_eviction_requeues_without_counting_a_failure() -> None:
    quota = Quota()
    result = rehearse_fake([job("a"), job("b")], admission=quota)
    a, b = result.workload("a"), result.workload("b")
    assert (a.state, b.state) == ("Complete", "Complete"), (a.message, b.message)
    # a was admitted, evicted once its pod was ready (deleted, backoffLimit 0 not spent), requeued.
    assert quota.events[:2] == ["admit a", "ready a"]
    assert any("evicted" in n for n in a.notes)
    assert len(a.pods) == 2
    assert quota.events.index("finished a Complete") < quota.events.index("admit b")


def test_defaults_admit_everything_and_leave_pods_unconstrained() -> None:
    runtime = FakeRuntime({"j-1": [Script(code=1), Script(code=0)]})
    result = rehearse_fake([job("j", completions=2, parallelism=2, backoff_limit=1)], runtime)
    w = result.workload("j")
    assert w.state == "Complete"
    assert all(p.node is None for p in w.pods)
    assert len(w.pods) == 3

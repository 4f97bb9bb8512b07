"""The batch/v1 Job API of Kubernetes 1.36 on the fake runtime (milliseconds): success policy, per-index
back-off, FailIndex, the interim conditions (issue 27 finding 2).

Fixtures are written here from the Kubernetes 1.36 documentation (concepts/workloads/controllers/job:
"Success policy", "Backoff limit per index", "Handling Pod and container failures") and the controller
(pkg/controller/job/job_controller.go syncJob: FailureTarget/SuccessCriteriaMet before Failed/Complete,
MaxFailedIndexesExceeded, FailedIndexes; success_policy.go matchSuccessPolicy; pod_failure_policy.go).
"""

from __future__ import annotations

from typing import Any

from rehearse.fake import FakeRuntime, Script, rehearse_fake


def indexed(name: str, completions: int, parallelism: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "completionMode": "Indexed",
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}},
            **spec,
        },
    }


def indexes(w: Any) -> list[int]:
    return sorted(int(p.labels["batch.kubernetes.io/job-completion-index"]) for p in w.pods)


def test_success_policy_met_ends_the_job_complete_and_removes_the_lingering_pods() -> None:
    # Docs "Success policy": the leader index 0 succeeding is enough; the workers run longer and would fail.
    job = indexed(
        "leader", 4, 4, backoffLimit=0, successPolicy={"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    )
    runtime = FakeRuntime({"leader-0": [Script(code=0, after_s=1)], "leader-": [Script(code=1, after_s=30)]})
    w = rehearse_fake([job], runtime).workload("leader")
    assert (w.state, w.message) == ("Complete", "SuccessPolicy: Matched rules at index 0")
    assert [c["type"] for c in w.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert w.wall_s < 5
    assert sorted(p.phase for p in w.pods) == ["Failed", "Failed", "Failed", "Succeeded"]


def test_success_policy_succeeded_count_alone_counts_any_indexes() -> None:
    job = indexed("count", 5, 5, successPolicy={"rules": [{"succeededCount": 2}]})
    runtime = FakeRuntime(
        {"count-3": [Script(after_s=1)], "count-4": [Script(after_s=2)], "count-": [Script(after_s=60)]}
    )
    w = rehearse_fake([job], runtime).workload("count")
    assert (w.state, w.message) == ("Complete", "SuccessPolicy: Matched rules at index 0")


def test_backoff_limit_per_index_fails_only_that_index_and_runs_every_other_index() -> None:
    # Docs "Backoff limit per index": index 1 fails every time; the others still run to success.
    job = indexed("per-index", 4, 2, backoffLimitPerIndex=1)
    runtime = FakeRuntime({"per-index-1": [Script(code=1)]})
    w = rehearse_fake([job], runtime).workload("per-index")
    assert (w.state, w.message) == ("Failed", "FailedIndexes: Job has failed indexes")
    assert [c["type"] for c in w.conditions] == ["FailureTarget", "Failed"]
    # Index 1 ran 1 + backoffLimitPerIndex times; every other index ran once and succeeded.
    assert indexes(w) == [0, 1, 1, 2, 3]
    assert w.status["failedIndexes"] == "1"
    assert w.status["completedIndexes"] == "0,2-3"


def test_max_failed_indexes_exceeded_fails_the_job_at_once() -> None:
    job = indexed("max", 6, 6, backoffLimitPerIndex=0, maxFailedIndexes=1)
    runtime = FakeRuntime(
        {"max-1": [Script(code=1, after_s=1)], "max-2": [Script(code=1, after_s=2)], "max-": [Script(after_s=60)]}
    )
    w = rehearse_fake([job], runtime).workload("max")
    assert (w.state, w.message) == (
        "Failed",
        "MaxFailedIndexesExceeded: Job has exceeded the specified maximal number of failed indexes",
    )
    assert w.wall_s < 10


def test_fail_index_action_fails_the_index_without_a_retry() -> None:
    # Docs "Pod failure policy" with FailIndex: exit code 42 means "this index cannot succeed".
    policy = {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]}
    job = indexed("fail-index", 3, 3, backoffLimitPerIndex=3, podFailurePolicy=policy)
    runtime = FakeRuntime({"fail-index-0": [Script(code=42)]})
    w = rehearse_fake([job], runtime).workload("fail-index")
    assert (w.state, w.message) == ("Failed", "FailedIndexes: Job has failed indexes")
    assert indexes(w) == [0, 1, 2]
    assert w.status["failedIndexes"] == "0"


def test_a_counted_failure_under_backoff_limit_per_index_is_retried_and_backoff_limit_defaults_to_unlimited() -> None:
    job = indexed("retry", 2, 2, backoffLimitPerIndex=2)
    runtime = FakeRuntime({"retry-0": [Script(code=1), Script(code=1), Script(code=0)]})
    w = rehearse_fake([job], runtime).workload("retry")
    assert w.state == "Complete", w.message
    assert indexes(w) == [0, 0, 0, 1]


def test_backoff_limit_exceeded_is_announced_by_failure_target_first() -> None:
    w = rehearse_fake([indexed("plain", 1, 1, backoffLimit=0)], FakeRuntime({"plain-": [Script(code=1)]})).workload(
        "plain"
    )
    assert (w.state, w.message) == ("Failed", "BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert [c["type"] for c in w.conditions] == ["FailureTarget", "Failed"]


def test_pod_failure_policy_rules_are_read_in_order_and_the_first_match_decides() -> None:
    # pod_failure_policy.go matchPodFailurePolicy: the rules in order, the first that matches decides. The chart's
    # NVRx Job relies on it: Ignore (DisruptionTarget, the gate's 75) before FailJob, which also matches those pods.
    rules = [
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}},
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
    ]
    ignored = indexed("first", 1, 1, backoffLimit=0, podFailurePolicy={"rules": rules})
    failed = indexed("second", 1, 1, backoffLimit=0, podFailurePolicy={"rules": rules})
    runtime = FakeRuntime({"first-0": [Script(code=75), Script(code=0)], "second-0": [Script(code=3)]})
    result = rehearse_fake([ignored, failed], runtime)
    first, second = result.workload("first"), result.workload("second")
    # 75 meets Ignore first: the pod is replaced without counting, and the replacement succeeds.
    assert (first.state, [p.phase for p in first.pods]) == ("Complete", ["Failed", "Succeeded"])
    # 3 meets only FailJob: the Job fails at once, naming the rule.
    assert second.state == "Failed"
    assert "matching FailJob rule" in second.message

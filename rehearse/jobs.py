"""The batch/v1 Job controller, as the rehearsal runs it.

Semantics mirrored from Kubernetes (docs: concepts/workloads/controllers/job; controller code:
kubernetes/kubernetes pkg/controller/job/job_controller.go, pod_failure_policy.go, indexed_job_utils.go):
- the apiserver gives the Job a uid and its pod template the labels `batch.kubernetes.io/controller-uid`
  and `batch.kubernetes.io/job-name` plus the legacy `controller-uid` and `job-name` (generateSelector in
  pkg/registry/batch/job/strategy.go; docs reference/labels-annotations-taints), so every pod carries them
  and a `fieldRef` to `metadata.labels['batch.kubernetes.io/controller-uid']` resolves to the Job's uid;
- parallelism and completions; completionMode Indexed: one successful pod per index, pod name
  `<job>-<index>-<random 5>`, hostname `<job>-<index>` unless the template sets `hostname`,
  `subdomain` honoured, the index in the annotation and label `batch.kubernetes.io/job-completion-index`
  and in env JOB_COMPLETION_INDEX; NonIndexed pods are `<job>-<random 5>`;
- a failed pod goes through podFailurePolicy first: rules in order, the first that matches decides
  (onExitCodes: containers that terminated with a non-zero code, optionally only `containerName`,
  operator In/NotIn; onPodConditions: a pod condition of that type and status, e.g. the
  DisruptionTarget condition `--kill` gives). FailJob fails the Job (reason PodFailurePolicy), Ignore
  replaces the pod without counting, Count (or no match) counts towards backoffLimit;
- more counted failures than backoffLimit: Failed, reason BackoffLimitExceeded; restartPolicy
  OnFailure counts container restarts too (restarts + failed pods > backoffLimit);
- activeDeadlineSeconds: Failed, reason DeadlineExceeded; a failed Job terminates its running pods;
- counted failures delay the replacement pod (Kubernetes: 10 s doubling, capped at 6 min; the
  rehearsal's base is an option so tests can shorten it);
- the final condition: Complete (reason CompletionsReached) or Failed with its reason.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from rehearse.controller import PodAPI
from rehearse.pods import Pod, PodPlan, random_suffix

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
UID_KEY = "batch.kubernetes.io/controller-uid"
NAME_KEY = "batch.kubernetes.io/job-name"
LEGACY_UID_KEY = "controller-uid"
LEGACY_NAME_KEY = "job-name"
BACKOFF_CAP_S = 360.0


@dataclass
class Condition:
    type: str
    reason: str
    message: str


@dataclass
class JobController:
    obj: dict[str, Any]
    backoff_base_s: float = 10.0
    kind: str = "Job"
    pods: list[Pod] = field(default_factory=list)
    condition: Condition | None = None
    started: float = 0.0
    finished: float | None = None
    failed: int = 0
    succeeded_indexes: set[int] = field(default_factory=set)
    succeeded: int = 0
    notes: list[str] = field(default_factory=list)
    long_lived: bool = False
    # The Job's status.conditions as the controller writes them (interim FailureTarget/SuccessCriteriaMet first).
    conditions: list[dict[str, str]] = field(default_factory=list)
    failed_indexes: set[int] = field(default_factory=set)
    index_failures: dict[int, int] = field(default_factory=dict)
    _not_before: float = 0.0
    _now: float = 0.0
    _index_not_before: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        meta, spec = self.obj["metadata"], self.obj["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        # What the apiserver assigns on create (a manifest has none; a server-side dump keeps its own).
        self.uid: str = str(meta.get("uid") or uuid.uuid4())
        self.indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
        self.parallelism: int = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        self.completions: int | None = int(completions) if completions is not None else None
        if self.indexed and self.completions is None:
            raise ValueError(f"Job {self.name}: completionMode Indexed needs completions")
        per_index = spec.get("backoffLimitPerIndex")
        self.backoff_limit_per_index: int | None = int(per_index) if per_index is not None else None
        if self.backoff_limit_per_index is not None and not self.indexed:
            raise ValueError(f"Job {self.name}: backoffLimitPerIndex needs completionMode Indexed")
        max_failed = spec.get("maxFailedIndexes")
        self.max_failed_indexes: int | None = int(max_failed) if max_failed is not None else None
        # Defaulting (pkg/apis/batch/v1/defaults.go): backoffLimit 6, or MaxInt32 with backoffLimitPerIndex.
        self.backoff_limit: int = int(spec.get("backoffLimit", 6 if per_index is None else 2**31 - 1))
        self.success_rules: list[dict[str, Any]] = (spec.get("successPolicy") or {}).get("rules", [])
        if self.success_rules and not self.indexed:
            raise ValueError(f"Job {self.name}: successPolicy needs completionMode Indexed")
        self.rules: list[dict[str, Any]] = (spec.get("podFailurePolicy") or {}).get("rules", [])
        self.deadline: int | None = spec.get("activeDeadlineSeconds")
        self.template: dict[str, Any] = spec["template"]
        self.restart_policy = self.template["spec"].get("restartPolicy", "Never")

    @property
    def done(self) -> bool:
        return self.condition is not None and not any(p.running for p in self.pods)

    @property
    def active(self) -> list[Pod]:
        return [p for p in self.pods if p.running]

    def start(self, api: PodAPI) -> None:
        self.started = api.now()
        self._fill(api)

    def _plan(self, index: int | None) -> PodPlan:
        labels = {
            **self.template.get("metadata", {}).get("labels", {}),
            UID_KEY: self.uid,
            NAME_KEY: self.name,
            LEGACY_UID_KEY: self.uid,
            LEGACY_NAME_KEY: self.name,
        }
        annotations = dict(self.template.get("metadata", {}).get("annotations", {}))
        extra_env: dict[str, str] = {}
        if index is not None:
            name = f"{self.name}-{index}-{random_suffix()}"
            hostname = f"{self.name}-{index}"
            labels[INDEX_KEY] = str(index)
            annotations[INDEX_KEY] = str(index)
            extra_env["JOB_COMPLETION_INDEX"] = str(index)
        else:
            name = f"{self.name}-{random_suffix()}"
            hostname = None
        return PodPlan(
            name=name,
            namespace=self.namespace,
            spec=self.template["spec"],
            workload=f"Job/{self.name}",
            hostname=hostname,
            labels=labels,
            annotations=annotations,
            extra_env=extra_env,
            # The Job controller creates its pods with metav1.NewControllerRef(job, controllerKind)
            # (pkg/controller/job/job_controller.go manageJob): controller and blockOwnerDeletion true.
            owner_references=[
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": self.name,
                    "uid": self.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        )

    def _wanted(self) -> list[int | None]:
        active = self.active
        room = self.parallelism - len(active)
        if room <= 0:
            return []
        if self.indexed:
            assert self.completions is not None
            busy = {int(p.plan.annotations[INDEX_KEY]) for p in active}
            done = self.succeeded_indexes | self.failed_indexes
            now = self._now
            free = [
                i
                for i in range(self.completions)
                if i not in done and i not in busy and self._index_not_before.get(i, 0.0) <= now
            ]
            return list(free[:room])
        if self.completions is None:
            # Work-queue Job: once a pod succeeded no new pods are made.
            return [None] * room if self.succeeded == 0 else []
        return [None] * max(0, min(room, self.completions - self.succeeded - len(active)))

    def _fill(self, api: PodAPI) -> None:
        self._now = api.now()
        if self.condition is not None or api.now() < self._not_before:
            return
        for index in self._wanted():
            self.pods.append(api.start(self._plan(index)))

    def _match(self, pod: Pod) -> tuple[str, str] | None:
        """(action, message) of the first podFailurePolicy rule the failed pod matches."""
        statuses = [
            (c["name"], pod.exit_codes.get(c["name"]))
            for c in [*pod.plan.spec.get("initContainers", []), *pod.plan.spec["containers"]]
        ]
        for rule in self.rules:
            on_codes = rule.get("onExitCodes")
            if on_codes:
                values = set(on_codes["values"])
                for name, code in statuses:
                    if code in (None, 0) or (on_codes.get("containerName") not in (None, name)):
                        continue
                    if (code in values) == (on_codes["operator"] == "In"):
                        index = pod.plan.annotations.get(INDEX_KEY, "")
                        return rule["action"], (
                            f"Container {name} for pod {pod.plan.namespace}/{pod.name} failed with exit code "
                            f"{code} matching {rule['action']} rule at index {index}"
                        )
            for pattern in rule.get("onPodConditions", []):
                for condition in pod.conditions:
                    if condition["type"] == pattern["type"] and condition["status"] == pattern.get("status", "True"):
                        return rule["action"], f"Pod {pod.plan.namespace}/{pod.name} has condition {pattern['type']}"
        return None

    def on_pod_end(self, api: PodAPI, pod: Pod) -> None:
        """Records the ended pod; replacements are made by the next `tick`, once every pod that ended
        in the same poll has been recorded."""
        if self.condition is not None or pod.deleted_by_controller:
            return
        index = int(pod.plan.annotations[INDEX_KEY]) if self.indexed else None
        if pod.phase == "Succeeded":
            self.succeeded += 1
            if index is not None:
                self.succeeded_indexes.add(index)
            self._evaluate(api)
            return
        match = self._match(pod)
        action = match[0] if match else "Count"
        if action == "FailJob":
            assert match is not None
            self._finish(api, "Failed", "PodFailurePolicy", match[1])
            return
        if action == "Ignore":
            return
        self.failed += 1
        if self.backoff_limit_per_index is not None and index is not None:
            # Per index (job_controller.go, indexed_job_utils.go getNewIndexFailureCounts): an index fails when
            # its failures exceed backoffLimitPerIndex, or at once on a FailIndex rule; its replacement waits
            # the back-off of its own failures.
            failures = self.index_failures.get(index, 0) + 1
            self.index_failures[index] = failures
            if action == "FailIndex" or failures > self.backoff_limit_per_index:
                self.failed_indexes.add(index)
            else:
                delay = min(self.backoff_base_s * 2 ** (failures - 1), BACKOFF_CAP_S)
                self._index_not_before[index] = api.now() + delay
            self._evaluate(api)
            return
        self._evaluate(api)
        if self.condition is None:
            delay = min(self.backoff_base_s * 2 ** (self.failed - 1), BACKOFF_CAP_S)
            self._not_before = api.now() + delay

    def _evaluate(self, api: PodAPI) -> None:
        """syncJob's order (job_controller.go): backoff limit, then failed indexes, then success policy, then
        completions."""
        restarts = sum(p.restarts for p in self.pods) if self.restart_policy == "OnFailure" else 0
        if self.failed + restarts > self.backoff_limit:
            self._finish(api, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            return
        if self.backoff_limit_per_index is not None:
            assert self.completions is not None
            if self.max_failed_indexes is not None and len(self.failed_indexes) > self.max_failed_indexes:
                self._finish(
                    api,
                    "Failed",
                    "MaxFailedIndexesExceeded",
                    "Job has exceeded the specified maximal number of failed indexes",
                )
                return
            if self.failed_indexes and len(self.failed_indexes) + len(self.succeeded_indexes) >= self.completions:
                self._finish(api, "Failed", "FailedIndexes", "Job has failed indexes")
                return
        matched = self._success_policy()
        if matched is not None:
            self._finish(api, "Complete", "SuccessPolicy", matched)
            return
        if self.indexed:
            complete = len(self.succeeded_indexes) == self.completions
        elif self.completions is None:
            complete = self.succeeded > 0 and not self.active
        else:
            complete = self.succeeded >= self.completions
        if complete:
            self._finish(api, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")

    def _success_policy(self) -> str | None:
        """success_policy.go matchSuccessPolicy: the first rule met, as "Matched rules at index N"."""
        if not self.success_rules or not self.succeeded_indexes:
            return None
        assert self.completions is not None
        for number, rule in enumerate(self.success_rules):
            count = rule.get("succeededCount")
            if rule.get("succeededIndexes") is not None:
                required = parse_indexes(str(rule["succeededIndexes"]), self.completions)
                if not required:
                    continue
                contained = len(required & self.succeeded_indexes)
                if contained == len(required) or (count is not None and contained >= int(count)):
                    return f"Matched rules at index {number}"
            elif count is not None and len(self.succeeded_indexes) >= int(count):
                return f"Matched rules at index {number}"
        return None

    def _finish(self, api: PodAPI, final: str, reason: str, message: str) -> None:
        """The interim condition (FailureTarget or SuccessCriteriaMet: delayTerminalCondition, on in 1.36),
        the remaining pods deleted, then the terminal one. Deleted pods end at once here (SIGKILL), so the
        terminal condition follows at once, whatever podReplacementPolicy says."""
        interim = "SuccessCriteriaMet" if final == "Complete" else "FailureTarget"
        self.conditions.append({"type": interim, "status": "True", "reason": reason, "message": message})
        for pod in self.active:
            pod.deleted_by_controller = True
            api.kill(pod)
        self.conditions.append({"type": final, "status": "True", "reason": reason, "message": message})
        self.condition = Condition(final, reason, message)
        self.finished = api.now()

    def status_fields(self) -> dict[str, str]:
        fields = {"succeeded": str(self.succeeded), "failed": str(self.failed)}
        if self.indexed:
            fields["completedIndexes"] = format_indexes(self.succeeded_indexes)
        if self.backoff_limit_per_index is not None:
            fields["failedIndexes"] = format_indexes(self.failed_indexes)
        return fields

    def tick(self, api: PodAPI) -> None:
        if self.condition is not None:
            return
        if self.deadline is not None and api.now() - self.started > self.deadline:
            self._finish(api, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        if self.restart_policy == "OnFailure":
            for pod in self.active:
                api.refresh(pod)
            self._evaluate(api)
            if self.condition is not None:
                return
        self._fill(api)

    def suspend(self, api: PodAPI, reason: str) -> None:
        # As for `suspend: true` (job_controller.go): active pods are deleted and not counted as failures;
        # on resume (`start`) the Job's start time, and so activeDeadlineSeconds, starts again.
        for pod in self.active:
            pod.deleted_by_controller = True
            api.kill(pod)

    def stop(self, api: PodAPI, reason: str) -> None:
        self.suspend(api, reason)

    def state(self) -> tuple[str, str]:
        if self.condition is None:
            return "Running", ""
        return self.condition.type, f"{self.condition.reason}: {self.condition.message}"


def parse_indexes(text: str, completions: int) -> set[int]:
    """ "0,2-3" as {0, 2, 3}, indexes below `completions` only (indexed_job_utils.go parseIndexesFromString)."""
    found: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            return set()
        found.update(i for i in range(low, high + 1) if i < completions)
    return found


def format_indexes(indexes: set[int]) -> str:
    """{0, 2, 3} as "0,2-3" (status.completedIndexes / failedIndexes)."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and i - 1 in indexes:
            first = out[-1].split("-")[0]
            out[-1] = f"{first}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)
